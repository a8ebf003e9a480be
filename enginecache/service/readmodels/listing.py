"""Catalog reads for the command line: listings streamed from the database, and the `show` views.

Every function here answers in plain dicts (the `--json` shapes of `model`, `engine` and `job`) and
imports neither SQLAlchemy nor SQLModel nor the core library: it reads through a `db.reader.RowSource`
(the stdlib `sqlite3` for a plain SQLite catalog at the head revision, else SQLAlchemy through
`Catalog.connect()`), so a read command in a new process costs little more than the interpreter and
Typer. `model_dict`, `engine_dict` and `job_dict` are the one definition of those shapes: the
ORM-facing `model_to_dict`, `engine_to_dict` and `job_to_dict` call them with records (any object with
the columns as attributes will do: a row of this module, or a SQLModel record).

Listings are pages (`limit`, `offset`) in a total order (newest first, the id breaking ties), so pages
never overlap and together cover every row. `stream_*` are context managers: the query runs (and a bad
filter raises) on entry, before the caller has written anything; the rows then stream from one
transaction, fetched `STREAM_BATCH` at a time (a server-side cursor on PostgreSQL), so memory stays flat
however many rows there are. Only the columns a listing shows are selected (never an engine's builder
log or cache-key ingredients).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from enginecache.core.cachekey import INGREDIENTS
from enginecache.core.targettext import split_targets
from enginecache.db.reader import Column, RowSource, SqliteReader, columns_of
from enginecache.errors import NotFoundError
from enginecache.service.context import AppContext
from enginecache.service.readmodels import modelrefs

STREAM_BATCH = 1000  # rows fetched from the database at a time
QUEUED = "QUEUED"  # db.models.JobStatus.QUEUED, without importing the SQLModel tables

# A model's, engine's or job's row: a row of this module or a SQLModel record (the same attributes).
Row = Any

MODEL_COLUMNS = columns_of("models")
# The engine columns only `engine show` prints (`engine_dict(detail=True)` adds them): the cache key's
# ingredients, the header's digest, the host, IO, builder log and last verification. A listing never
# selects them.
ENGINE_DETAIL_ONLY = frozenset(
    {
        "build_options",
        "builder_log",
        "header_blake3",
        "host",
        "io",
        "key_ingredients",
        "os",
        "precision_recipe",
        "provenance",
        "target_info",
        "verified_at",
    }
)
ENGINE_LIST_COLUMNS = [column for column in columns_of("engines") if column[0] not in ENGINE_DETAIL_ONLY]
ENGINE_DETAIL_COLUMNS = columns_of("engines")
JOB_COLUMNS = columns_of("jobs")
MODEL_NAME: Column = ("model_name", "")
VERSION: Column = ("version", "")
MODEL_VERSION: Column = ("model_version", "")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


# -- the shapes ---------------------------------------------------------------------------


def model_dict(model: Row, *, version: int | None, aliases: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """A model as `model list/show --json` print it: its columns, its version within its name (None for
    a converted variant) and the aliases that point at it ((alias, GPU class or "")), then its
    inspection (`info`)."""
    return {
        "id": model.id,
        "name": model.name,
        "version": version,
        "aliases": [{"alias": alias, "gpu_class": gpu or None} for alias, gpu in aliases],
        "digest": model.digest,
        "filename": model.filename,
        "store_path": model.store_path,
        "size_bytes": model.size_bytes,
        "parent_id": model.parent_id,
        "recipe": model.recipe or None,
        "created_at": model.created_at.isoformat(),
        **{k: v for k, v in model.info.items() if k not in ("path", "digest", "size_bytes")},
    }


def engine_dict(
    home: str | os.PathLike[str],
    engine: Row,
    *,
    model_name: str | None,
    model_version: int | None,
    detail: bool = False,
    cache_hit: bool | None = None,
) -> dict[str, Any]:
    """An engine as `engine list/show --json` and `build --json` print it, with its model's name and
    version (`model_version`: None where the model is gone); `detail` adds each cache-key ingredient,
    the recipe, options, target, host, IO and the builder log."""
    data: dict[str, Any] = {
        "id": engine.id,
        "model": model_name,
        "model_version": model_version,
        "model_id": engine.model_id,
        "variant_model_id": engine.variant_model_id,
        "backend": engine.backend,
        "backend_version": engine.backend_version,
        "precision": engine.precision,
        "targets": list(split_targets(engine.targets)),
        "cache_key": engine.cache_key,
        "sha256": engine.sha256,
        "blake3": engine.blake3,
        "size_bytes": engine.size_bytes,
        "build_seconds": engine.build_seconds,
        "status": engine.status,
        "path": os.path.join(home, engine.blob_path) if engine.blob_path else None,
        "created_at": engine.created_at.isoformat(),
        "finished_at": _iso(engine.finished_at),
        "warnings": list(engine.warnings),
        "error": engine.error,
    }
    if cache_hit is not None:
        data["cache_hit"] = cache_hit
    if detail:
        ingredients = engine.key_ingredients
        data["key_ingredients"] = {name: ingredients.get(name) for name in INGREDIENTS}
        for name in INGREDIENTS:
            data[f"key_{name}"] = ingredients.get(name)
        data["precision_recipe"] = engine.precision_recipe
        data["build_options"] = engine.build_options
        data["target_info"] = engine.target_info
        data["os"] = engine.os
        data["host"] = engine.host
        data["io"] = engine.io
        data["header_blake3"] = engine.header_blake3 or None  # of the first HEAD_BYTES; none before 0015
        data["verified_at"] = _iso(engine.verified_at)
        data["builder_log"] = engine.builder_log
        data["provenance"] = provenance_of(engine.provenance)
    return data


def provenance_of(recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """Where an engine came from, as `engine show` and the engine page say it: `kind` "built" (here,
    by a worker; what a row before migration 0018 records, `{}`) or "imported" (`engine import`: who,
    from where, what was declared, what its header proved, what is unknown, and once a host loaded
    it, `proven`)."""
    return dict(recorded) if recorded else {"kind": "built"}


_NO_WAITING = object()


def job_dict(job: Row, waiting: object = _NO_WAITING) -> dict[str, Any]:
    """A job as `jobs --json` and `job show --json` print it; `waiting` (when given) says what a
    QUEUED job no live worker can run is waiting for (a str or None); without it, no `waiting` key."""
    data: dict[str, Any] = {
        "id": job.id,
        "kind": job.kind,
        "status": job.status,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "progress": round(job.progress, 4),
        "phase": job.phase,
        "worker": job.lease_owner,
        "runner_pid": job.runner_pid,
        "requirements": job.requirements,
        "error": job.error,
        "log_tail": job.log_tail,
        "created_at": job.created_at.isoformat(),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "result_engine_id": job.result_engine_id,
        "cancel_requested": job.cancel_requested,
        "payload": job.payload,
    }
    if waiting is not _NO_WAITING:
        data["waiting"] = waiting
    return data


# -- reading -----------------------------------------------------------------------------


@contextlib.contextmanager
def catalog_rows(app: AppContext) -> Iterator[RowSource]:
    """A RowSource on the app's catalog for one read: the stdlib reader where it can serve (a plain
    SQLite file at the head revision), else SQLAlchemy (which creates and migrates a catalog first,
    and maps an unreachable one to CatalogUnavailableError)."""
    reader = SqliteReader.open(app.db_url)
    if reader is not None:
        try:
            yield reader
        finally:
            reader.close()
        return
    from enginecache.db.catalog import ConnectionRows

    with app.catalog.connect() as connection:
        yield ConnectionRows(connection, batch=STREAM_BATCH)


@functools.cache
def _row_type(names: tuple[str, ...]) -> Any:
    return collections.namedtuple("CatalogRow", names)


def _select(
    source: RowSource,
    sql: str,
    columns: Sequence[Column],
    params: Mapping[str, Any] | None = None,
    *,
    limit: int | None = None,
    offset: int = 0,
) -> Iterator[Row]:
    """Rows of `sql` (which selects `columns`, in order) with the columns as attributes."""
    make = _row_type(tuple(name for name, _ in columns))._make
    for values in source.rows(sql, params or {}, columns, limit=limit, offset=offset):
        yield make(values)


def _names(columns: Iterable[Column], alias: str) -> str:
    return ", ".join(f"{alias}.{name}" for name, _ in columns)


# -- lookups ------------------------------------------------------------------------------


def resolve_model_id(source: RowSource, ref: str | int) -> int:
    """The id of the model `ref` names (`service.readmodels.modelrefs`: id, NAME, NAME@vN, NAME@ALIAS,
    digest); NotFoundError, BadInputError or AmbiguousError otherwise."""
    return modelrefs.resolve(source, ref).model_id


def model_aliases(source: RowSource, names: Sequence[str] | None = None) -> dict[int, list[tuple[str, str]]]:
    """Model id -> the aliases in effect that point at it, (alias, GPU class or ""), by alias."""
    found: dict[int, list[tuple[str, str]]] = {}
    for (_, alias, gpu), model_id in sorted(modelrefs.alias_targets(source, names).items()):
        found.setdefault(model_id, []).append((alias, gpu))
    return found


def model_version(source: RowSource, model_id: int | None) -> int | None:
    """The model's version within its name; None for a converted variant or a model that is gone."""
    sql = f"SELECT {modelrefs.VERSION_SQL.format(m='m')} AS version FROM models AS m WHERE m.id = :id"
    for row in _select(source, sql, [VERSION], {"id": model_id}):
        return int(row.version) if row.version else None
    return None


class WaitingReasons:
    """What a QUEUED job that no live worker can run waits for ('waiting for a worker with ...'), as
    `service.builds.submit.waiting_reason` says it, with the live workers read once per listing. Routing
    (which loads the backends) is imported only when a QUEUED job asks."""

    def __init__(self, source: RowSource) -> None:
        self._source = source
        self._capabilities: list[Mapping[str, Any]] | None = None

    def reason(self, status: str, requirements: Mapping[str, Any]) -> str | None:
        if status != QUEUED:
            return None
        from enginecache.service.jobs.routing import can_run, describe_requirements, takes_queued_jobs

        live = self._live()  # another command's one-shot worker claims only its own job: it never counts
        if any(takes_queued_jobs(c) and can_run(requirements, c) for c in live):
            return None
        return f"waiting for {describe_requirements(requirements)}"

    def _live(self) -> list[Mapping[str, Any]]:
        """The capabilities of the workers that are online and beat within WORKER_ALIVE_SECONDS."""
        if self._capabilities is None:
            from enginecache.service.jobs.routing import WORKER_ALIVE_SECONDS

            since = datetime.now(UTC) - timedelta(seconds=WORKER_ALIVE_SECONDS)
            columns = columns_of("workers", ("capabilities", "heartbeat_at"))
            online = _select(
                self._source, "SELECT capabilities, heartbeat_at FROM workers WHERE status = 'online'", columns
            )
            self._capabilities = [
                w.capabilities for w in online if w.heartbeat_at is not None and w.heartbeat_at >= since
            ]
        return self._capabilities


# -- listings -----------------------------------------------------------------------------


@contextlib.contextmanager
def stream_models(app: AppContext, *, limit: int | None = None, offset: int = 0) -> Iterator[Iterator[dict[str, Any]]]:
    """Models, newest first, as `model_dict`s (each with its version and aliases)."""
    version = modelrefs.VERSION_SQL.format(m="m")
    sql = (
        f"SELECT {_names(MODEL_COLUMNS, 'm')}, {version} AS version FROM models AS m "
        "ORDER BY m.created_at DESC, m.id DESC"
    )
    with catalog_rows(app) as source:
        aliases = model_aliases(source)
        rows = _select(source, sql, [*MODEL_COLUMNS, VERSION], limit=limit, offset=offset)
        yield (model_dict(row, version=row.version or None, aliases=aliases.get(row.id, ())) for row in _started(rows))


def show_model(app: AppContext, ref: str | int) -> dict[str, Any]:
    """The model `ref` names (`service.readmodels.modelrefs`) as `model_dict`, as `model list` has it."""
    with catalog_rows(app) as source:
        found = modelrefs.resolve(source, ref)
        version = modelrefs.VERSION_SQL.format(m="m")
        sql = f"SELECT {_names(MODEL_COLUMNS, 'm')}, {version} AS version FROM models AS m WHERE m.id = :id"
        rows = list(_select(source, sql, [*MODEL_COLUMNS, VERSION], {"id": found.model_id}))
        aliases = model_aliases(source, [found.name])
    if not rows:
        raise NotFoundError(f"no model {ref!r} in the catalog")
    return model_dict(rows[0], version=rows[0].version or None, aliases=aliases.get(found.model_id, ()))


def _engine_sql(columns: Sequence[Column], where: Sequence[str]) -> str:
    return (
        f"SELECT {_names(columns, 'e')}, m.name AS model_name, {modelrefs.VERSION_SQL.format(m='m')} AS model_version "
        "FROM engines AS e LEFT OUTER JOIN models AS m ON m.id = e.model_id"
        + (" WHERE " + " AND ".join(where) if where else "")
    )


class EngineRows(Iterator[dict[str, Any]]):
    """The rows of an engine listing (`engine_dict`s), and what its `model` filter named (`scope`: None
    without one), known before the first row is read."""

    def __init__(self, rows: Iterator[dict[str, Any]], scope: modelrefs.ModelRef | None) -> None:
        self._rows = rows
        self.scope = scope

    def __next__(self) -> dict[str, Any]:
        return next(self._rows)


@contextlib.contextmanager
def stream_engines(
    app: AppContext,
    *,
    model: str | None = None,
    status: str | None = None,
    limit: int | None = None,
    offset: int = 0,
) -> Iterator[EngineRows]:
    """Engines, newest first, as `engine_dict`s (with their model's name and version); `model` and
    `status` filter. `model` is a reference (`service.readmodels.modelrefs`): a bare NAME covers every
    version of the name, NAME@vN, NAME@ALIAS, an id or a digest one model. An unknown model raises on
    entry (NotFoundError; BadInputError for a version the name lacks)."""
    home = str(app.home)
    with catalog_rows(app) as source:
        where: list[str] = []
        params: dict[str, Any] = {}
        scope = None
        if model is not None:
            scope = modelrefs.resolve(source, model)
            ids = scope.scope_ids
            where.append("e.model_id IN (" + ", ".join(f":model_{i}" for i in range(len(ids))) + ")")
            params.update({f"model_{i}": model_id for i, model_id in enumerate(ids)})
        if status is not None:
            where.append("e.status = :status")
            params["status"] = status.upper()
        sql = _engine_sql(ENGINE_LIST_COLUMNS, where) + " ORDER BY e.created_at DESC, e.id DESC"
        rows = _select(
            source, sql, [*ENGINE_LIST_COLUMNS, MODEL_NAME, MODEL_VERSION], params, limit=limit, offset=offset
        )
        yield EngineRows(
            (
                engine_dict(home, row, model_name=row.model_name, model_version=row.model_version or None)
                for row in _started(rows)
            ),
            scope,
        )


def show_engine(app: AppContext, engine_id: int) -> dict[str, Any]:
    """Everything recorded about one engine (`engine_dict` with `detail`)."""
    with catalog_rows(app) as source:
        sql = _engine_sql(ENGINE_DETAIL_COLUMNS, ["e.id = :id"])
        rows = list(_select(source, sql, [*ENGINE_DETAIL_COLUMNS, MODEL_NAME, MODEL_VERSION], {"id": engine_id}))
    if not rows:
        raise NotFoundError(f"no engine with id {engine_id} in the catalog")
    row = rows[0]
    return engine_dict(app.home, row, model_name=row.model_name, model_version=row.model_version or None, detail=True)


@contextlib.contextmanager
def stream_jobs(
    app: AppContext, *, status: str | None = None, limit: int | None = None, offset: int = 0
) -> Iterator[Iterator[dict[str, Any]]]:
    """Jobs, newest first (by id), as `job_dict`s with what each QUEUED one waits for."""
    where = " WHERE j.status = :status" if status is not None else ""
    sql = f"SELECT {_names(JOB_COLUMNS, 'j')} FROM jobs AS j{where} ORDER BY j.id DESC"
    params = {"status": status.upper()} if status is not None else {}
    with catalog_rows(app) as source:
        waiting = WaitingReasons(source)
        rows = _select(source, sql, JOB_COLUMNS, params, limit=limit, offset=offset)
        yield (job_dict(row, waiting.reason(row.status, row.requirements)) for row in _started(rows))


def show_job(app: AppContext, job_id: int) -> dict[str, Any]:
    with catalog_rows(app) as source:
        sql = f"SELECT {_names(JOB_COLUMNS, 'j')} FROM jobs AS j WHERE j.id = :id"
        rows = list(_select(source, sql, JOB_COLUMNS, {"id": job_id}))
        if not rows:
            raise NotFoundError(f"no job with id {job_id} in the catalog")
        return job_dict(rows[0], WaitingReasons(source).reason(rows[0].status, rows[0].requirements))


def _started(rows: Iterator[Row]) -> Iterator[Row]:
    """`rows` with its query already run: the first row is fetched now (so a failing query raises
    before the caller writes anything), then handed out first."""
    first = next(rows, None)
    if first is None:
        return iter(())
    return _chain_first(first, rows)


def _chain_first(first: Row, rest: Iterator[Row]) -> Iterator[Row]:
    yield first
    yield from rest
