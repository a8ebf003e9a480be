"""A serving process's cache hit without the ORM: the stdlib's sqlite3 on the SQLite catalog.

A new serving process that finds its engine should cost what loading the engine costs (import the
runtime, create the session) and little more. The full lookup (`service.serving.loadpath`) imports
SQLAlchemy, SQLModel, Alembic (its migration check) and onnx (profiles from the model's inputs):
0.6-1.0 s before any engine byte is read. This module answers a hit with none of them:

1. the catalog file from `home`/`db_url` (SQLite only) at this code's schema revision
   (`db.catalogfile`: `locate`, `is_head`; the full path migrates a catalog that is behind);
2. the model's digest from the stat cache row for (host, path), trusted by the same rule as
   `service.serving.statcache` (`service.serving.statrule`: every file's size, mtime, ctime and inode, not racy);
3. the engine from the memo the full path wrote for this exact request (`service.serving.memo`: digest,
   spec, backend and tool versions, host facts, code), confirmed still READY and with the model's
   READY engines unchanged since (a retired, corrupt or newly built engine sends it down the full
   path), read in one read transaction;
4. load through `service.serving.engineload` (its signed statement where keys are trusted, checked
   against the row and this request: the stat cache's model digest, backend, library version,
   precision, OS; header check, verified read, `Backend.load`) from the path the engine's sha256
   implies (`core.blobpaths`; the row's `blob_path` is not read).

What it writes goes through the engine-lifecycle gateway (`db.engines`) on this stdlib connection, the
same SQL the full path runs on SQLAlchemy: the load event, a CORRUPT or TAMPERED mark with its audit
row (one transaction), a load error's note. Rows and columns decode by `db.columns`.

Anything it cannot vouch for (a PostgreSQL URL, a calibration file, another schema revision, no
memo, a stat mismatch, a racy entry, a backend library missing) returns None and the caller takes
the full path, which stays the reference and writes the memo for next time. Once it has chosen an
engine its outcomes are final, as the full path's are: a hit, or EngineRejectedError (CORRUPT,
INCOMPATIBLE, ERROR), each recorded as a load event.
"""

from __future__ import annotations

import os
import sqlite3
import time

from enginecache.core.backends.loadtypes import PhaseTimer
from enginecache.core.backends.registry import get_backend
from enginecache.core.diskbudget import BlobHold
from enginecache.core.lazyimport import import_backend
from enginecache.core.pathtext import absolute_text
from enginecache.core.signing import stat_receipts
from enginecache.core.verdicts import Verdict
from enginecache.db import engines
from enginecache.db.catalogfile import REVISION_SQL, CatalogFile, head_revision, is_head, locate, sqlite_file_uri
from enginecache.db.columns import decode_json
from enginecache.db.sqlexec import SqliteExecutor, SqliteWrite
from enginecache.errors import BackendUnavailableError, EngineRejectedError, TargetError
from enginecache.service.serving.engineload import EngineFacts, load_engine, load_error_note
from enginecache.service.serving.localhost import local_host
from enginecache.service.serving.memo import memo_ingredients, memo_key, ready_list
from enginecache.service.serving.runtimetypes import LoadedEngine, RuntimeSpec
from enginecache.service.serving.statrule import cached_files_match, stat_entry

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any

    from enginecache.core.backends.base import Backend
    from enginecache.core.fingerprint import HostFingerprint
    from enginecache.db.models import EngineRecord


def _log() -> Any:
    """This module's logger, on first use: a hit logs nothing and does not import `logging`."""
    import logging

    return logging.getLogger(__name__)


HIT_PATH_ENV = "ENGINECACHE_HIT_PATH"  # "off": always take the full path
SQLITE_BUSY_TIMEOUT_S = 30.0  # as db.catalog's busy timeout
_ENGINE_COLUMNS = (
    "id",
    "model_id",
    "status",
    "backend",
    "backend_version",
    "precision",
    "targets",
    "sha256",
    "blake3",
    "header_blake3",
    "chunk_blake3",
    "build_options",
    "cache_key",
    "onnx_digest",
    "size_bytes",
    "signed_statement",
    "signature",
)


def enabled() -> bool:
    return os.environ.get(HIT_PATH_ENV, "").strip().lower() not in ("off", "0", "no", "false")


def _connect(path: str) -> sqlite3.Connection:
    """Read-write on an existing file (never creates one), autocommit (we BEGIN ourselves), and the
    catalog's own settings for the one write: synchronous=FULL, foreign keys, the busy timeout."""
    connection = sqlite3.connect(
        sqlite_file_uri(path),
        uri=True,
        timeout=SQLITE_BUSY_TIMEOUT_S,
        isolation_level=None,
        check_same_thread=False,
    )
    connection.execute("PRAGMA synchronous=FULL")
    connection.execute("PRAGMA foreign_keys=ON")
    return connection


# An engine's TensorRT-RTX runtime caches, newest first as the ORM path reads them
# (service.serving.runtimecache.for_catalog_engine).
RUNTIME_CACHE_SQL = (
    "SELECT engine_sha256, gpu_sku, compute_capability, rtx_version, cuda_version, sha256, blake3, "
    "chunk_blake3, size_bytes FROM runtime_caches WHERE engine_id = ? ORDER BY created_at DESC, id DESC"
)


class CacheRow:
    """A `runtime_caches` row as the hit path reads it (`RUNTIME_CACHE_SQL`'s columns, in order)."""

    __slots__ = (
        "blake3",
        "chunk_blake3",
        "compute_capability",
        "cuda_version",
        "engine_sha256",
        "gpu_sku",
        "rtx_version",
        "sha256",
        "size_bytes",
    )

    def __init__(self, row: tuple[Any, ...]) -> None:
        (
            self.engine_sha256,
            self.gpu_sku,
            self.compute_capability,
            self.rtx_version,
            self.cuda_version,
            self.sha256,
            self.blake3,
            self.chunk_blake3,
            self.size_bytes,
        ) = row


def runtime_cache_rows(connection: sqlite3.Connection, engine_id: int) -> list[CacheRow]:
    """Engine `engine_id`'s runtime caches, newest first, on the hit path's connection."""
    return [CacheRow(row) for row in connection.execute(RUNTIME_CACHE_SQL, (engine_id,))]


class _Found:
    __slots__ = ("backend_version", "caches", "digest", "engine", "model_id", "model_name")

    def __init__(
        self,
        digest: str,
        model_id: int,
        model_name: str,
        engine: dict[str, Any],
        backend_version: str,
        caches: list[CacheRow],
    ) -> None:
        self.digest = digest
        self.model_id = model_id
        self.model_name = model_name
        self.engine = engine
        self.backend_version = backend_version
        self.caches = caches  # the engine's runtime caches (TensorRT-RTX), newest first


def _lookup(
    connection: sqlite3.Connection,
    path: str,
    model_stat: list[Any],
    spec: RuntimeSpec,
    backend: Backend,
    backend_version: str,
    host: HostFingerprint,
) -> _Found | None:
    """Steps 1-3 in one read transaction (one snapshot of the catalog): None where it cannot vouch."""
    connection.execute("BEGIN")
    try:
        revisions = [row[0] for row in connection.execute(REVISION_SQL)]
        if not is_head(revisions):
            _log().debug("hit path: catalog at revision %s, this code's head is %s", revisions, head_revision())
            return None
        stat_row = connection.execute(
            "SELECT files, digest, racy FROM onnx_stat_cache WHERE hostname = ? AND path = ?",
            (host.hostname, path),
        ).fetchone()
        if stat_row is None or not cached_files_match(path, model_stat, decode_json(stat_row[0]), bool(stat_row[2])):
            _log().debug("hit path: no trusted stat cache entry for %s", path)
            return None
        digest = str(stat_row[1])
        vouching = stat_receipts()
        if vouching is not None and not vouching.holds_digest(host.hostname, path, decode_json(stat_row[0]), digest):
            _log().debug("hit path: the stat cache entry for %s has no receipt of this user's hash", path)
            return None
        key = memo_key(memo_ingredients(digest, spec, backend, backend_version, host))
        memo = connection.execute(
            "SELECT model_id, engine_id, ready_engines FROM engine_memos WHERE memo_key = ?", (key,)
        ).fetchone()
        if memo is None:
            _log().debug("hit path: no memo %s for %s", key[:12], path)
            return None
        model_id, engine_id, remembered = int(memo[0]), int(memo[1]), str(memo[2])
        ready = engines.ready_engine_ids(SqliteExecutor(connection), model_id)
        if ready_list(ready) != remembered or engine_id not in ready:
            _log().debug("hit path: model %s's READY engines are %s, the memo saw %s", model_id, ready, remembered)
            return None
        model = connection.execute("SELECT name, digest FROM models WHERE id = ?", (model_id,)).fetchone()
        engine = engines.engine_fields(SqliteExecutor(connection), engine_id, _ENGINE_COLUMNS)
        if model is None or model[1] != digest or engine is None:
            return None
        caches = runtime_cache_rows(connection, engine_id)  # published for RTX engines only
        return _Found(digest, model_id, str(model[0]), engine, backend_version, caches)
    finally:
        connection.execute("COMMIT")


def _mark(connection: sqlite3.Connection, engine_id: int, reason: str, *, tampered: bool) -> None:
    """The engine marked CORRUPT (or TAMPERED), with its audit row, in one transaction
    (`db.engines.mark_corrupt` / `mark_tampered`, as the full path marks it)."""
    from enginecache.service.access import audit  # the rare path pays for its imports
    from enginecache.service.serving.loading import LOAD_OR_BUILD

    change = engines.mark_tampered if tampered else engines.mark_corrupt
    try:
        with SqliteWrite(connection) as ex:
            change(ex, engine_id, actor=audit.current_actor(), by=LOAD_OR_BUILD, reason=reason)
    except sqlite3.Error as err:  # the verdict stands; `enginecache verify` marks it later
        _log().warning("engine %s not marked %s: %s", engine_id, "TAMPERED" if tampered else "CORRUPT", err)


def _signed_request(found: _Found, spec: RuntimeSpec, host: HostFingerprint) -> dict[str, Any]:
    """What this request asks of the engine's signed statement (core.signing): the model digest the
    stat cache gave, the backend, this host's library version, the precision and the OS. (The cache
    key is the full path's to compare: it needs a plan.)"""
    return {
        "model.digest": found.digest,
        "backend": spec.backend,
        "backend_version": found.backend_version,
        "precision": spec.precision,
        "ingredients.os": host.os,
    }


def _mark_load_error(connection: sqlite3.Connection, engine_id: int, note: str) -> None:
    try:
        with SqliteWrite(connection) as ex:
            engines.note_load_error(ex, engine_id, note)
    except sqlite3.Error as err:  # the verdict stands and is raised; only the note is lost
        _log().warning("engine %s: load error not noted: %s", engine_id, err)


def _record(
    connection: sqlite3.Connection,
    event: Mapping[str, Any],
    outcome: str,
    reason: str,
    phases: Mapping[str, float],
    started: float,
) -> None:
    """The load event (`db.engines.record_load_event`, as the full path records it); a refused write is
    logged, never raised."""
    row = {
        **event,
        **engines.phase_seconds(phases),
        "outcome": outcome,
        "reason": reason,
        "total_s": time.perf_counter() - started,
        "stat_cache_hit": True,
        "phases": phases,
    }
    try:
        with SqliteWrite(connection) as ex:
            engines.record_load_event(ex, row)
    except sqlite3.Error as err:
        _log().warning("cache event not recorded: %s", err)


def engine_record_loader(where: CatalogFile, engine_id: int) -> Callable[[], EngineRecord]:
    """Reads the engine's whole row as an `EngineRecord` when first asked (imports the ORM then)."""

    def load() -> EngineRecord:
        from enginecache.db.models import EngineRecord

        columns = list(EngineRecord.__table__.columns.keys())  # type: ignore[attr-defined]
        connection = _connect(where.path)
        try:
            fields = engines.engine_fields(SqliteExecutor(connection), engine_id, columns)
        finally:
            connection.close()
        if fields is None:
            raise LookupError(f"engine {engine_id} is no longer in the catalog")
        return EngineRecord(**fields)

    return load


def try_hit(
    onnx_path: str | Path,
    spec: RuntimeSpec,
    *,
    home: str | Path | None,
    db_url: str | None,
    host: HostFingerprint | None,
    started: float,
    imported_s: float | None = None,
) -> LoadedEngine | None:
    """The loaded engine for a request this path can vouch for, else None (take the full path).
    `imported_s`: the seconds the caller spent importing this module (phase `import_hitpath`).

    Raises EngineRejectedError (CORRUPT, INCOMPATIBLE, ERROR) for the engine it chose, after
    recording the event; any other error there is recorded as 'failed' and raised.
    """
    if not enabled() or spec.calibration is not None:
        return None
    where = locate(home, db_url)
    if where is None:
        return None
    path = absolute_text(onnx_path)  # the stat cache's key, as service.serving.statcache writes it
    try:
        model_stat = stat_entry(path)
        backend = get_backend(spec.backend)
    except (OSError, TargetError):
        return None  # the full path says what is wrong, and records it
    timer = PhaseTimer()
    if imported_s is not None:
        timer.phases["import_hitpath"] = imported_s
    with timer.phase("fingerprint"):
        host = host or local_host(probe_gpus=backend.device == "gpu")
    try:
        with timer.phase("import_runtime"):
            # Here, before the lookup, rather than in load_engine (where it is then a no-op): the
            # import's cost after the lookup's read transaction is in docs/runtime.md.
            import_backend(backend.module, backend.declaration.install_hint)
        with timer.phase("lookup"):
            backend_version = backend.version()
            connection = _connect(where.path)
            try:
                found = _lookup(connection, path, model_stat, spec, backend, backend_version, host)
            except BaseException:
                connection.close()
                raise
    except (BackendUnavailableError, sqlite3.Error, ValueError, TypeError, KeyError) as err:
        _log().debug("hit path declined %s: %s", path, err)
        return None
    if found is None:
        connection.close()
        return None
    try:
        return _load(connection, where, found, spec, backend, host, timer, started)
    finally:
        connection.close()


def _runtime_cache(where: CatalogFile, found: _Found, host: HostFingerprint) -> str | None:
    """The runtime cache the full path would hand over for this engine and host (TensorRT-RTX)."""
    if not found.caches:  # imported only where there are caches: a plain hit imports nothing for them
        return None
    from enginecache.core.runtimecache import has_runtime_caches, host_target
    from enginecache.service.serving.runtimecache import for_hit

    if not has_runtime_caches(str(found.engine["backend"])):
        return None
    return for_hit(str(where.home), found.caches, host_target(str(found.engine["sha256"]), host))


def _load(
    connection: sqlite3.Connection,
    where: CatalogFile,
    found: _Found,
    spec: RuntimeSpec,
    backend: Backend,
    host: HostFingerprint,
    timer: PhaseTimer,
    started: float,
) -> LoadedEngine:
    facts = EngineFacts.from_row(where.home, found.engine)
    event = {
        "hostname": host.hostname,
        "model_name": found.model_name,
        "model_id": found.model_id,
        "engine_id": facts.id,
        "backend": spec.backend,
        "precision": spec.precision,
        "host_target": backend.host_target(host),
    }
    hold = BlobHold()
    try:
        session = load_engine(
            facts,
            timer,
            on_corrupt=lambda reason: _mark(connection, facts.id, reason, tampered=False),
            hold=hold,
            request=_signed_request(found, spec, host),
            on_tampered=lambda reason: _mark(connection, facts.id, reason, tampered=True),
            runtime_cache=_runtime_cache(where, found, host),
        )
    except EngineRejectedError as err:
        if err.verdict == Verdict.ERROR.outcome:
            _mark_load_error(connection, facts.id, load_error_note(str(err)))
        _record(connection, event, "rejected", str(err), timer.phases, started)
        raise
    except BaseException as err:
        _record(connection, event, "failed", f"{type(err).__name__}: {err}", timer.phases, started)
        raise
    _record(connection, event, "hit", f"engine {facts.id}", timer.phases, started)
    loaded = LoadedEngine(
        session,
        engine_record_loader(where, facts.id),
        "hit",
        dict(timer.phases),
        found.digest,
        facts=facts,
        model_name=found.model_name,
        via="hitpath",
    )
    loaded._hold = hold
    return loaded
