"""Use cases: back up a home (the catalog and every blob it references) while others write, and
restore a backup into an empty home. docs/backup.md is the operator's page.

A backup is a folder laid out as the store is, plus the catalog and a manifest:

    DEST/manifest.json                  what is here: catalog kind, revision, each file's digest and size
    DEST/catalog.db | catalog.dump      SQLite's online-backup copy | pg_dump's custom-format archive
    DEST/objects/sha256/<2 hex>/<sha>   the blobs the catalog copy references (engines, job inputs)
    DEST/models/<digest>/<files>        the model bundles it references (external data included)

Backup takes one consistent state of the catalog first (`service.backupdb`: SQLite's backup API,
or pg_dump sharing an exported snapshot with the query that lists the references), then copies the
blobs *that state* references, hashing each as it is copied and comparing it with its digest (a
model bundle by the model digest's own rule). It holds the store's lock shared from before the
snapshot until the last copy, as a publish does, so `enginecache gc` (which takes it exclusive)
removes nothing meanwhile; publishers go on. Writes that commit after the snapshot are not in the
backup, and nothing the backup's catalog references can be missing from it: a READY engine's blob
or an OK model's bundle that is missing or damaged fails the backup (it names the blob); another
engine's blob (CORRUPT, RETIRED), a CORRUPT model's bundle or a blob a job's payload names that is
gone or damaged is left out and listed under `skipped`. The folder is written beside DEST and
renamed to DEST once complete: a failed backup leaves nothing at DEST. Nothing in the live catalog
or store is written (but the store's lock file).

Restore refuses a home that is not empty and a catalog that has rows, copies every file into a
folder beside the home while checking it against the manifest, puts the catalog back (the SQLite
file, or pg_restore in one transaction into the --db database), checks the row counts and that
every READY engine's blob and every OK model's bundle is there, migrates the catalog to the head
revision, and only then renames the folder to the home. A failure leaves the home as it was (and
drops what pg_restore created).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from enginecache.core.distributions import distribution_version
from enginecache.core.hashing import DigestResult, hash_file
from enginecache.core.store import ArtifactStore, fsync_dir
from enginecache.db.catalog import normalize_url
from enginecache.db.models import EngineStatus
from enginecache.db.reader import sqlite_url
from enginecache.errors import BackupRefusedError, EngineCacheError, IntegrityCheckError
from enginecache.service import access, audit
from enginecache.service.backupdb import (
    CORRUPT,
    POSTGRESQL,
    SQLITE,
    CatalogState,
    EngineRef,
    ModelRef,
    catalog_kind,
    check_references,
    check_sqlite_target,
    drop_tables,
    is_digest,
    known_revision,
    migrate_to_head,
    postgres_snapshot,
    prepare_postgres_target,
    require_integrity,
    restore_postgres,
    restore_sqlite,
    self_contained,
    sqlite_path,
    sqlite_snapshot,
)
from enginecache.service.backupfiles import (
    bundle_digest,
    copy_hashed,
    fsync_tree,
    is_empty_dir,
    remove_tree,
    safe_relative,
)
from enginecache.service.context import AppContext

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "enginecache-backup"
FORMAT_VERSION = 1
CATALOG_FILES = {SQLITE: "catalog.db", POSTGRESQL: "catalog.dump"}

# progress(phase, message): "snapshot" once the catalog's state is taken (before any blob is copied),
# "copied" once every file is in place, "published" at the end.
Progress = Callable[[str, str], None]


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
            "blobs": len(self.manifest["blobs"]),
            "models": len(self.manifest["models"]),
            **self.manifest["totals"],
            "skipped": self.manifest["skipped"],
        }


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "home": str(self.home),
            "catalog": self.catalog,
            "kind": self.kind,
            "revision_backup": self.revision_backup,
            "revision": self.revision,
            "blobs": self.blobs,
            "models": self.models,
            "files": self.files,
            "bytes": self.bytes,
            "tables": self.tables,
        }


def safe_url(url: str) -> str:
    return sa.make_url(normalize_url(url)).render_as_string(hide_password=True)


def _report(progress: Progress | None, phase: str, message: str) -> None:
    logger.info("%s", message)
    if progress is not None:
        progress(phase, message)


# -- backup ----------------------------------------------------------------------------------


def backup(
    app: AppContext, dest: Path, *, pg_bin: Path | None = None, progress: Progress | None = None
) -> BackupResult:
    """Back up the catalog and every blob it references into the new folder `dest` (see the module
    docstring); workers and serving processes may go on writing meanwhile. Writes nothing to the
    live catalog or store but the audit event of the backup, once it is published."""
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
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
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
            _report(
                progress,
                "snapshot",
                f"catalog {safe_url(app.db_url)} at revision {state.revision}: {len(state.models)} models, "
                f"{len(state.engines)} engines with a blob",
            )
            blobs, skipped = _copy_blobs(store, state, work)
            models, skipped_models = _copy_models(store, state.models, work)
        catalog_digest = hash_file(catalog_file)
        files = [*blobs, *(f for model in models for f in model["files"])]
        manifest: dict[str, Any] = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "enginecache_version": distribution_version("enginecache") or "unknown",
            "source": {"home": str(home), "catalog": safe_url(app.db_url)},
            "catalog": {
                "kind": kind,
                "file": catalog_file.name,
                "sha256": catalog_digest.sha256,
                "size": catalog_digest.size,
                "alembic_revision": state.revision,
                "tables": state.tables,
                **state.details,
            },
            "blobs": blobs,
            "models": models,
            "skipped": {"blobs": skipped, "models": skipped_models},
            "totals": {"files": len(files), "bytes": sum(int(f["size"]) for f in files)},
        }
        _report(progress, "copied", f"{len(files)} files copied and verified")
        _write_json(work / MANIFEST, manifest)
        fsync_tree(work)
        try:
            os.rename(work, dest)
        except OSError as err:
            raise BackupRefusedError(f"{dest} could not be written (did it appear meanwhile?): {err}") from err
        fsync_dir(dest.parent)
    except BaseException:
        remove_tree(work)
        raise
    _report(progress, "published", f"backup written to {dest}")
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


def _copy_blobs(
    store: ArtifactStore, state: CatalogState, work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copy each blob the snapshot references once, verified: the engines' (a READY engine's is
    required) and those job payloads name (where the store has them). Returns the manifest's entries
    and what was left out."""
    engines: dict[str, list[EngineRef]] = {}
    for engine in state.engines:
        engines.setdefault(engine.sha256, []).append(engine)
    copied: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for sha256 in sorted({*engines, *state.job_blobs}):
        refs = engines.get(sha256, [])
        jobs = state.job_blobs.get(sha256, [])
        names = {"engine_ids": [r.engine_id for r in refs], "job_ids": jobs}
        required = any(ref.status == EngineStatus.READY for ref in refs)
        what = _blob_words(sha256, refs, jobs)
        if not is_digest(sha256):
            if required:
                raise IntegrityCheckError(f"{what}: the catalog's digest is not a sha256")
            skipped.append({"sha256": sha256, **names, "reason": "the recorded digest is not a sha256"})
            continue
        source = store.blob_path(sha256)
        relative = store.relative(source)
        try:
            got = copy_hashed(source, work / relative)
        except FileNotFoundError as err:
            if required:
                raise IntegrityCheckError(
                    f"{what} is missing from the store ({source}); `enginecache verify --all` marks its engine CORRUPT"
                ) from err
            if refs:  # a job's payload may name a digest that is no blob (a model's): only engines' are reported
                skipped.append({"sha256": sha256, **names, "reason": f"missing from the store ({source})"})
            continue
        if got.sha256 != sha256:
            (work / relative).unlink()
            if required:
                raise IntegrityCheckError(
                    f"{what} at {source} hashes to {got.sha256}: the store's copy is damaged; "
                    "`enginecache verify --all` marks its engine CORRUPT, then back up again"
                )
            skipped.append({"sha256": sha256, **names, "reason": f"damaged in the store (hashes to {got.sha256})"})
            continue
        copied.append({"path": relative, "sha256": sha256, "blake3": got.blake3, "size": got.size, **names})
    for entry in skipped:
        logger.warning(
            "left out of the backup: blob %s (engines %s, jobs %s): %s",
            entry["sha256"],
            entry["engine_ids"],
            entry["job_ids"],
            entry["reason"],
        )
    return copied, skipped


def _blob_words(sha256: str, engines: list[EngineRef], jobs: list[int]) -> str:
    named = [f"engine {e.engine_id} ({e.status})" for e in engines] + [f"job {job}" for job in jobs]
    return f"blob {sha256} of {', '.join(named)}"


def _copy_models(
    store: ArtifactStore, models: list[ModelRef], work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copy each model bundle, every file verified and the bundle checked against the model digest; a
    CORRUPT model's bundle that does not verify is left out. Returns the manifest's entries and what
    was left out."""
    entries: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for model in models:
        try:
            entries.append(_copy_model(store, model, work))
        except IntegrityCheckError as err:
            if model.status != CORRUPT:
                raise
            remove_tree(work / "models" / model.digest)
            skipped.append({"model_id": model.model_id, "digest": model.digest, "reason": str(err)})
            logger.warning("left out of the backup: CORRUPT model %s: %s", model.model_id, err)
    return entries, skipped


def _copy_model(store: ArtifactStore, model: ModelRef, work: Path) -> dict[str, Any]:
    what = f"model {model.model_id} ({model.digest}, {model.status})"
    if not is_digest(model.digest):
        raise IntegrityCheckError(f"{what}: the catalog's digest is not a sha256")
    source_dir = store.model_dir(model.digest)
    files: dict[str, DigestResult] = {}
    listed: list[dict[str, Any]] = []
    for name in dict.fromkeys([model.filename, *model.external]):
        relative = f"models/{model.digest}/{safe_relative(name, what)}"
        try:
            got = copy_hashed(source_dir / name, work / relative)
        except FileNotFoundError as err:
            raise IntegrityCheckError(f"{what}: {source_dir / name} is missing from the store") from err
        files[name] = got
        listed.append({"name": name, "path": relative, "sha256": got.sha256, "size": got.size})
    digest = bundle_digest(model.filename, files)
    if digest != model.digest:
        raise IntegrityCheckError(f"{what}: the bundle at {source_dir} hashes to {digest}: the store's copy is damaged")
    return {"digest": model.digest, "filename": model.filename, "model_id": model.model_id, "files": listed}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "x", encoding="utf-8") as stream:
        json.dump(data, stream, indent=2, sort_keys=False)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())


# -- restore ---------------------------------------------------------------------------------


def read_manifest(src: Path) -> dict[str, Any]:
    """A backup's manifest, checked to be one this version reads."""
    path = src / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise BackupRefusedError(f"{src} is not an enginecache backup: it has no {MANIFEST}") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BackupRefusedError(f"{path} cannot be read as a backup manifest: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupRefusedError(f"{path} is not an enginecache backup manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BackupRefusedError(
            f"{path} is backup format {manifest.get('format_version')!r}; this enginecache reads {FORMAT_VERSION}"
        )
    catalog = _require_fields(
        manifest.get("catalog"), ("kind", "file", "sha256", "size", "tables"), f"{path}: the catalog entry"
    )
    if catalog["kind"] not in CATALOG_FILES or catalog["file"] != CATALOG_FILES[catalog["kind"]]:
        raise BackupRefusedError(f"{path}: unknown catalog kind or file {catalog['kind']!r}, {catalog['file']!r}")
    for key in ("blobs", "models"):
        if not isinstance(manifest.get(key), list):
            raise BackupRefusedError(f"{path} is not a complete backup manifest: it has no {key} list")
    for entry in manifest["blobs"]:
        _require_fields(entry, ("path", "sha256", "size"), f"{path}: a blob entry")
    for model in manifest["models"]:
        _require_fields(model, ("digest", "filename", "files"), f"{path}: a model entry")
        for entry in model["files"]:
            _require_fields(entry, ("name", "path", "sha256", "size"), f"{path}: model {model['digest']}'s file entry")
    return manifest


def _require_fields(entry: object, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """`entry` as a dict that has `keys`; BackupRefusedError naming `what` otherwise."""
    if not isinstance(entry, dict) or any(key not in entry for key in keys):
        raise BackupRefusedError(f"{what} is incomplete: it needs {', '.join(keys)}")
    return entry


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
    work = Path(tempfile.mkdtemp(prefix=f".{home.name}.restore-", dir=home.parent))
    staged: Path | None = None
    placed: Path | None = None
    restored_tables: list[str] = []
    try:
        store = ArtifactStore(home)
        blobs, models, files, size = _restore_files(store, src, manifest, work)
        _report(progress, "copied", f"{files} files copied and verified against {src / MANIFEST}")
        source = src / str(catalog_meta["file"])
        if target_file is not None:
            staged = (
                work / target_file.relative_to(home)
                if target_file.is_relative_to(home)
                else target_file.parent / f".{target_file.name}.restore-{work.name}"
            )
            _restore_verified(
                source, staged, str(catalog_meta["sha256"]), int(catalog_meta["size"]), "the backup's catalog"
            )
            state = restore_sqlite(staged)
            url = sqlite_url(staged)
        else:
            try:
                got = hash_file(source)
            except FileNotFoundError as err:
                raise IntegrityCheckError(f"the backup's catalog {source} is missing from the backup") from err
            _check_digest(source, got, str(catalog_meta["sha256"]), int(catalog_meta["size"]), "the backup's catalog")
            prepare_postgres_target(app.db_url, tables, drop=True)
            restored_tables = list(tables)
            state = restore_postgres(app.db_url, source, pg_bin, archive_major=catalog_meta.get("pg_dump_major"))
            url = app.db_url
        _check_state(state, tables, blobs, models, src)
        revision = migrate_to_head(url)
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
        try:
            os.rename(work, home)
        except OSError as err:
            raise BackupRefusedError(f"the home {home} is no longer empty ({err}); nothing was restored") from err
        fsync_dir(home.parent)
    except BaseException:
        remove_tree(work)
        for path in (staged, placed):
            if path is not None and not path.is_relative_to(work):
                path.unlink(missing_ok=True)
        if restored_tables:
            _undo_pg_restore(app.db_url, restored_tables)
        raise
    _report(progress, "published", f"restored {src} into {home} ({safe_url(app.db_url)}, revision {revision})")
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
    )


def _undo_pg_restore(url: str, tables: list[str]) -> None:
    """Drop what pg_restore created after a later step failed; a failure to do so is logged (the
    error that led here is the one raised)."""
    try:
        drop_tables(url, tables)
    except (sa.exc.SQLAlchemyError, EngineCacheError):
        logger.exception("could not drop the restored tables %s from %s; drop them by hand", tables, safe_url(url))


def _check_digest(path: Path, got: DigestResult, sha256: str, size: int, what: str) -> None:
    if got.sha256 != sha256 or got.size != size:
        raise IntegrityCheckError(
            f"{what} {path} is damaged: sha256 {got.sha256} ({got.size} bytes), "
            f"the manifest records {sha256} ({size} bytes)"
        )


def _restore_verified(source: Path, dest: Path, sha256: str, size: int, what: str) -> DigestResult:
    try:
        got = copy_hashed(source, dest)
    except FileNotFoundError as err:
        raise IntegrityCheckError(f"{what} {source} is missing from the backup") from err
    _check_digest(source, got, sha256, size, what)
    return got


def _restore_files(
    store: ArtifactStore, src: Path, manifest: dict[str, Any], work: Path
) -> tuple[set[str], set[str], int, int]:
    """Copy every blob and model file the manifest lists from `src` into `work`, each checked as it is
    copied; returns the engine digests, the model digests, the file count and the bytes."""
    blobs: set[str] = set()
    models: set[str] = set()
    files = size = 0
    for entry in manifest["blobs"]:
        sha256 = str(entry["sha256"])
        if not is_digest(sha256):
            raise IntegrityCheckError(f"the manifest lists a blob digest that is not a sha256: {sha256!r}")
        relative = store.relative(store.blob_path(sha256))
        if entry["path"] != relative:
            raise IntegrityCheckError(f"the manifest lists blob {sha256} at {entry['path']!r}, not at {relative}")
        got = _restore_verified(src / relative, work / relative, sha256, int(entry["size"]), "backup blob")
        blobs.add(sha256)
        files, size = files + 1, size + got.size
    for model in manifest["models"]:
        digest = str(model["digest"])
        what = f"model {digest}"
        if not is_digest(digest):
            raise IntegrityCheckError(f"the manifest lists a model digest that is not a sha256: {digest!r}")
        hashed: dict[str, DigestResult] = {}
        for entry in model["files"]:
            name = str(entry["name"])
            relative = f"models/{digest}/{safe_relative(name, what)}"
            if entry["path"] != relative:
                raise IntegrityCheckError(f"the manifest lists {what}'s {name} at {entry['path']!r}, not at {relative}")
            hashed[name] = _restore_verified(
                src / relative, work / relative, str(entry["sha256"]), int(entry["size"]), "backup file"
            )
            files, size = files + 1, size + hashed[name].size
        if str(model["filename"]) not in hashed or bundle_digest(str(model["filename"]), hashed) != digest:
            raise IntegrityCheckError(
                f"the backup's bundle of {what} ({src / 'models' / digest}) does not hash to its digest"
            )
        models.add(digest)
    return blobs, models, files, size


def _check_state(state: CatalogState, tables: dict[str, int], blobs: set[str], models: set[str], src: Path) -> None:
    """The restored catalog holds the rows the manifest counted and references only restored files."""
    if state.tables != tables:
        differ = sorted(name for name in {*tables, *state.tables} if tables.get(name) != state.tables.get(name))
        raise IntegrityCheckError(
            f"the restored catalog's rows differ from {src / MANIFEST}'s count in "
            + ", ".join(f"{name} ({state.tables.get(name)} restored, {tables.get(name)} recorded)" for name in differ)
        )
    check_references(state, blobs, models, f"the catalog of {src}")
