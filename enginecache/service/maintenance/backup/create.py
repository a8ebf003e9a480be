"""Use case: back up a home (the catalog and every blob it references) while others write.

One consistent state of the catalog is taken first (service.maintenance.backup.sqlite: SQLite's backup API, or
service.maintenance.backup.postgres: pg_dump sharing an exported snapshot with the query that lists the
references), then the blobs *that state* references are copied, verified (service.maintenance.backup.copy). The
store's lock is held shared from before the snapshot until the last copy, as a publish does, so
`enginecache gc` (which takes it exclusive) removes nothing meanwhile; publishers go on. The folder
is written beside DEST and renamed to DEST once complete: a failed backup leaves nothing at DEST, and
removes that folder; one killed leaves it claimed in the home's store, where `enginecache gc` finds it
(service.maintenance.workdirs). Nothing in the live catalog or store is written but the store's lock
file, that claim (removed when the backup ends), and the audit event once the backup is published.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginecache.core.store import ArtifactStore
from enginecache.db.catalog import safe_url
from enginecache.errors import BackupRefusedError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.maintenance.backup.copy import copy_blobs, copy_models
from enginecache.service.maintenance.backup.database import SQLITE, catalog_kind, sqlite_path
from enginecache.service.maintenance.backup.files import fsync_tree, is_empty_dir, publish_folder, remove_tree
from enginecache.service.maintenance.backup.manifest import CATALOG_FILES, MANIFEST, build_manifest, write_manifest
from enginecache.service.maintenance.backup.postgres import postgres_snapshot
from enginecache.service.maintenance.backup.progress import Progress, report
from enginecache.service.maintenance.backup.sqlite import sqlite_snapshot
from enginecache.service.maintenance.workdirs import backup_folder


@dataclass(frozen=True)
class BackupResult:
    dest: Path
    manifest: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        catalog = self.manifest["catalog"]
        return {
            "dest": str(self.dest),
            "manifest": str(self.dest / MANIFEST),
            "created_at": self.manifest["created_at"],
            "enginecache_version": self.manifest["enginecache_version"],
            "catalog": {key: catalog[key] for key in ("kind", "file", "alembic_revision", "sha256", "size", "tables")},
            "audit_head": catalog.get("audit_head"),
            "blobs": len(self.manifest["blobs"]),
            "models": len(self.manifest["models"]),
            **self.manifest["totals"],
            "skipped": self.manifest["skipped"],
        }


def backup(
    app: AppContext, dest: Path, *, pg_bin: Path | None = None, progress: Progress | None = None
) -> BackupResult:
    """Back up the catalog and every blob it references into the new folder `dest` (see the module
    docstring); workers and serving processes may go on writing meanwhile. Writes nothing to the
    live catalog or store but the backup's claim in its tmp/ (removed when the backup ends) and the
    audit event of the backup, once it is published."""
    access.require(app, "backup")
    dest = Path(dest).expanduser().resolve()
    home = app.home.resolve()
    if dest == home or dest.is_relative_to(home):
        raise BackupRefusedError(f"{dest} is inside the home it would back up ({home}); choose a folder outside it")
    if not is_empty_dir(dest):
        raise BackupRefusedError(f"{dest} already exists and is not an empty folder: a backup goes into a new one")
    kind = catalog_kind(app.db_url)
    if kind == SQLITE and not sqlite_path(app.db_url).is_file():
        raise BackupRefusedError(f"there is no SQLite catalog at {sqlite_path(app.db_url)} to back up")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with backup_folder(app.store.tmp_dir, dest) as work:
        try:
            catalog_file = work / CATALOG_FILES[kind]
            store = ArtifactStore(home)
            # The store's lock, shared (as a publish takes it): gc, which takes it exclusive, waits until
            # every blob this snapshot references is copied, and publishers go on meanwhile.
            with store.publish_lock():
                if kind == SQLITE:
                    state = sqlite_snapshot(sqlite_path(app.db_url), catalog_file)
                else:
                    state = postgres_snapshot(app.db_url, catalog_file, pg_bin)
                report(
                    progress,
                    "snapshot",
                    f"catalog {safe_url(app.db_url)} at revision {state.revision}: {len(state.models)} models, "
                    f"{len(state.engines)} engines with a blob",
                )
                blobs, skipped = copy_blobs(store, state, work)
                models, skipped_models = copy_models(store, state.models, work)
            manifest = build_manifest(
                source={"home": str(home), "catalog": safe_url(app.db_url)},
                kind=kind,
                catalog_file=catalog_file,
                state=state,
                blobs=blobs,
                models=models,
                skipped={"blobs": skipped, "models": skipped_models},
            )
            report(progress, "copied", f"{manifest['totals']['files']} files copied and verified")
            write_manifest(work, manifest)
            fsync_tree(work)
            publish_folder(work, dest, lambda err: f"{dest} could not be written (did it appear meanwhile?): {err}")
        except BaseException:
            remove_tree(work)
            raise
    report(progress, "published", f"backup written to {dest}")
    audit.record(
        app,
        audit.CATALOG_BACKUP,
        str(dest),
        {
            "blobs": len(manifest["blobs"]),
            "models": len(manifest["models"]),
            "revision": manifest["catalog"]["alembic_revision"],
        },
    )
    return BackupResult(dest, manifest)
