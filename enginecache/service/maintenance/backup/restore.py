"""Use case: restore a backup into an empty home.

Restore refuses a home that is not empty and a catalog that has rows, copies every file into a
folder beside the home while checking it against the manifest (service.maintenance.backup.restorecopy), puts the
catalog back (the SQLite file, or pg_restore in one transaction into the --db database), checks the
row counts and that every READY engine's blob and every OK model's bundle is there, migrates the
catalog to the head revision, checks its audit log's hash chain (reaching the head the manifest
recorded, where it recorded one: `service.access.auditverify`), and only then renames the folder to
the home. A failure leaves the home as it was (and drops what pg_restore created). The folder is held
while the restore runs (service.maintenance.workdirs): one a killed restore left is `enginecache gc`'s
to remove.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from enginecache.core.store import ArtifactStore, fsync_dir
from enginecache.db.catalog import safe_url
from enginecache.db.reader import sqlite_url
from enginecache.errors import BackupRefusedError, EngineCacheError, IntegrityCheckError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.access.auditverify import verify_catalog
from enginecache.service.context import AppContext
from enginecache.service.maintenance.backup.database import (
    POSTGRESQL,
    SQLITE,
    CatalogState,
    catalog_kind,
    check_references,
    open_catalog,
    sqlite_path,
)
from enginecache.service.maintenance.backup.files import fsync_tree, is_empty_dir, publish_folder, remove_tree
from enginecache.service.maintenance.backup.manifest import MANIFEST, read_manifest
from enginecache.service.maintenance.backup.postgres import drop_tables, prepare_postgres_target, restore_postgres
from enginecache.service.maintenance.backup.progress import Progress, report
from enginecache.service.maintenance.backup.restorecopy import restore_files, restore_verified, verify_in_place
from enginecache.service.maintenance.backup.schema import known_revision, migrate_to_head
from enginecache.service.maintenance.backup.sqlite import (
    check_sqlite_target,
    require_integrity,
    restore_sqlite,
    self_contained,
)
from enginecache.service.maintenance.workdirs import restore_folder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestoreResult:
    home: Path
    catalog: str
    kind: str
    revision_backup: str | None
    revision: str | None
    blobs: int
    models: int
    files: int
    bytes: int
    tables: dict[str, int]
    audit: dict[str, Any] = field(default_factory=dict)  # the restored audit chain: rows, head, triggers

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "home": str(self.home)}


def restore(
    app: AppContext, src: Path, *, pg_bin: Path | None = None, progress: Progress | None = None
) -> RestoreResult:
    """Restore the backup at `src` into the app's home (absent or empty) and catalog (a new SQLite
    file, or a PostgreSQL database without rows), verified against its manifest and migrated to the
    head revision (see the module docstring)."""
    access.require(app, "restore")
    src = Path(src).expanduser().resolve()
    manifest = read_manifest(src)
    catalog_meta = manifest["catalog"]
    backup_kind = str(catalog_meta["kind"])
    kind = catalog_kind(app.db_url)
    if kind != backup_kind:
        raise BackupRefusedError(
            f"{src} holds a {backup_kind} catalog and the target catalog {safe_url(app.db_url)} is {kind}: "
            + (
                "give the target database with --db postgresql://..."
                if backup_kind == POSTGRESQL
                else "restore it into SQLite"
            )
        )
    home = app.home.resolve()
    if not is_empty_dir(home):
        held = sorted(p.name for p in home.iterdir())[:5] if home.is_dir() else []
        raise BackupRefusedError(
            f"the home {home} is not empty ({', '.join(held) or 'not a folder'}): restore only into an empty home"
        )
    revision_backup = catalog_meta.get("alembic_revision")
    if not known_revision(revision_backup):
        raise BackupRefusedError(
            f"{src} was made at schema revision {revision_backup}, which this enginecache does not know "
            "(a newer version made it)"
        )
    tables = {str(name): int(count) for name, count in catalog_meta["tables"].items()}
    target_file = sqlite_path(app.db_url) if kind == SQLITE else None
    if target_file is not None:
        check_sqlite_target(target_file)
    else:
        prepare_postgres_target(app.db_url, tables, drop=False)

    home.parent.mkdir(parents=True, exist_ok=True)
    with restore_folder(home) as work:
        staged: Path | None = None
        placed: Path | None = None
        restored_tables: list[str] = []
        try:
            store = ArtifactStore(home)
            blobs, models, files, size = restore_files(store, src, manifest, work)
            report(progress, "copied", f"{files} files copied and verified against {src / MANIFEST}")
            source = src / str(catalog_meta["file"])
            sha256, file_size, what = str(catalog_meta["sha256"]), int(catalog_meta["size"]), "the backup's catalog"
            if target_file is not None:
                staged = (
                    work / target_file.relative_to(home)
                    if target_file.is_relative_to(home)
                    else target_file.parent / f".{target_file.name}.restore-{work.name}"
                )
                restore_verified(source, staged, sha256, file_size, what)
                state = restore_sqlite(staged)
                url = sqlite_url(staged)
            else:
                verify_in_place(source, sha256, file_size, what)
                prepare_postgres_target(app.db_url, tables, drop=True)
                restored_tables = list(tables)
                state = restore_postgres(app.db_url, source, pg_bin, archive_major=catalog_meta.get("pg_dump_major"))
                url = app.db_url
            _check_state(state, tables, blobs, models, src)
            revision = migrate_to_head(url)
            audit_chain = _check_audit_chain(url, catalog_meta.get("audit_head"), src)
            if staged is not None:
                require_integrity(staged, "the restored catalog")
                self_contained(staged)
            fsync_tree(work)
            if staged is not None and target_file is not None and not staged.is_relative_to(work):
                try:
                    os.link(staged, target_file)
                except FileExistsError as err:
                    raise BackupRefusedError(
                        f"the catalog file {target_file} appeared meanwhile; nothing was restored"
                    ) from err
                placed = target_file
                staged.unlink()
                fsync_dir(target_file.parent)
            publish_folder(work, home, lambda err: f"the home {home} is no longer empty ({err}); nothing was restored")
        except BaseException:
            remove_tree(work)
            for path in (staged, placed):
                if path is not None and not path.is_relative_to(work):
                    path.unlink(missing_ok=True)
            if restored_tables:
                _undo_pg_restore(app.db_url, restored_tables)
            raise
    report(progress, "published", f"restored {src} into {home} ({safe_url(app.db_url)}, revision {revision})")
    restored = AppContext(home=home, db_url=app.db_url)  # the event goes into the restored catalog
    try:
        audit.record(
            restored,
            audit.CATALOG_RESTORE,
            safe_url(app.db_url),
            {"src": str(src), "home": str(home), "revision_backup": revision_backup, "revision": revision},
        )
    finally:
        restored.close()  # leaves no SQLite -wal/-shm beside the restored file
    return RestoreResult(
        home=home,
        catalog=safe_url(app.db_url),
        kind=kind,
        revision_backup=revision_backup,
        revision=revision,
        blobs=len(blobs),
        models=len(models),
        files=files,
        bytes=size,
        tables=state.tables,
        audit=audit_chain,
    )


def _undo_pg_restore(url: str, tables: list[str]) -> None:
    """Drop what pg_restore created after a later step failed; a failure to do so is logged (the
    error that led here is the one raised)."""
    try:
        drop_tables(url, tables)
    except (sa.exc.SQLAlchemyError, EngineCacheError):
        logger.exception("could not drop the restored tables %s from %s; drop them by hand", tables, safe_url(url))


def _check_audit_chain(url: str, head: Any, src: Path) -> dict[str, Any]:
    """The restored catalog's audit chain, verified whole and (where the manifest recorded the head,
    `catalog.audit_head`) holding that row with that hash: IntegrityCheckError naming the first break.
    A missing or disabled append-only trigger is logged, not refused (the backup's catalog had it so).
    What was found: rows, the chain's last row, the triggers' problems."""
    anchor: tuple[int, str] | None = None
    if head is not None:
        if not isinstance(head, dict) or "id" not in head or not isinstance(head.get("hash"), str):
            raise BackupRefusedError(f"{src / MANIFEST}: the catalog's audit_head is incomplete: it needs id and hash")
        anchor = None if head["id"] is None else (int(head["id"]), head["hash"])
    with open_catalog(url) as catalog:
        result = verify_catalog(catalog, anchor=anchor)
    if result.chain.broken is not None:
        raise IntegrityCheckError(
            f"the restored catalog's audit log does not verify against {src / MANIFEST}: {result.chain.broken.message}"
        )
    for problem in result.triggers:
        logger.error("the restored catalog's audit log is not protected: %s", problem)
    last = result.chain.last
    return {
        "rows": result.chain.rows,
        "last": {"id": last[0], "hash": last[1]} if last else None,
        "trigger_problems": result.triggers,
    }


def _check_state(state: CatalogState, tables: dict[str, int], blobs: set[str], models: set[str], src: Path) -> None:
    """The restored catalog holds the rows the manifest counted and references only restored files."""
    if state.tables != tables:
        differ = sorted(name for name in {*tables, *state.tables} if tables.get(name) != state.tables.get(name))
        raise IntegrityCheckError(
            f"the restored catalog's rows differ from {src / MANIFEST}'s count in "
            + ", ".join(f"{name} ({state.tables.get(name)} restored, {tables.get(name)} recorded)" for name in differ)
        )
    check_references(state, blobs, models, f"the catalog of {src}")
