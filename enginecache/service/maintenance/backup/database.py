"""The catalog's half of backup and restore: a consistent copy of the database taken while others
write, what that copy references, and putting a copy back.

- SQLite (service.maintenance.backup.sqlite): the stdlib's online backup API (`sqlite3.Connection.backup`) in
  one step, which copies every page inside one read transaction (WAL: writers go on meanwhile), into
  a file switched to the rollback journal (one self-contained file); its references are read from
  that copy.
- PostgreSQL (service.maintenance.backup.postgres): one REPEATABLE READ, READ ONLY transaction exports its
  snapshot (`pg_export_snapshot()`); `pg_dump --snapshot` dumps exactly that snapshot (custom
  format) while the same transaction reads the references and row counts. The dump and the blob
  list are the same state of the database, whatever commits or is collected meanwhile.
- Restore: SQLite copies the file; PostgreSQL runs `pg_restore --single-transaction` (all or
  nothing) into a database without rows. Then the schema is brought to the head revision
  (service.maintenance.backup.schema).

This module holds what both databases share: which kind of catalog a URL names, what one snapshot
of it holds (`CatalogState`), and reading that through one query function whatever the database.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from enginecache.db.auditchain import HEAD_TABLE
from enginecache.db.catalog import Catalog, normalize_url
from enginecache.db.models import EngineStatus
from enginecache.errors import BackupRefusedError, IntegrityCheckError
from enginecache.service.jobs.payloadblobs import payload_digests

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
CORRUPT = "CORRUPT"  # a model's status once its stored bundle no longer hashed to its digest

# One query on a catalog connection: SQL in; the result's column names and rows out.
Query = Callable[[str], tuple[list[str], Sequence[Sequence[Any]]]]


@dataclass(frozen=True)
class EngineRef:
    """An engine row that names a blob."""

    engine_id: int
    status: str
    sha256: str


@dataclass(frozen=True)
class ModelRef:
    """A model row: its bundle is `models/<digest>/` holding `filename` and `external` files."""

    model_id: int
    digest: str
    filename: str
    external: tuple[str, ...]
    status: str  # models.status (OK | CORRUPT) from revision 0009 on; "OK" before


@dataclass
class CatalogState:
    """What one snapshot of the catalog holds: revision, rows per table, the blobs it references."""

    revision: str | None
    tables: dict[str, int]
    engines: list[EngineRef] = field(default_factory=list)
    models: list[ModelRef] = field(default_factory=list)
    job_blobs: dict[str, list[int]] = field(default_factory=dict)  # digest -> jobs whose payload names it
    runtime_cache_blobs: dict[str, list[int]] = field(default_factory=dict)  # digest -> runtime_caches rows
    details: dict[str, Any] = field(default_factory=dict)


# -- the catalog a URL names -------------------------------------------------------------------


def catalog_kind(url: str) -> str:
    name = sa.make_url(normalize_url(url)).get_backend_name()
    if name == SQLITE:
        return SQLITE
    if name == POSTGRESQL:
        return POSTGRESQL
    raise BackupRefusedError(f"backup and restore support SQLite and PostgreSQL catalogs, not {name!r}")


def sqlite_path(url: str) -> Path:
    """The file of a SQLite catalog URL."""
    database = sa.make_url(normalize_url(url)).database
    if not database or database == ":memory:" or database.startswith("file:"):
        raise BackupRefusedError(f"not a SQLite catalog file: {url}")
    return Path(database).expanduser().resolve()


@contextlib.contextmanager
def open_catalog(url: str) -> Iterator[Catalog]:
    """A Catalog on `url` that migrates nothing, disposed of (its connections closed) afterwards."""
    catalog = Catalog(url, migrate=False)
    try:
        yield catalog
    finally:
        catalog.dispose()


# -- reading a snapshot --------------------------------------------------------------------------


def quote_name(name: str) -> str:
    """An SQL identifier, double-quoted."""
    return '"' + name.replace('"', '""') + '"'


def connection_query(connection: sa.Connection) -> Query:
    """The `Query` of a SQLAlchemy connection (inside whatever transaction it has)."""

    def query(sql: str) -> tuple[list[str], list[Any]]:
        result = connection.exec_driver_sql(sql)
        return list(result.keys()), list(result.all())

    return query


def _rows(query: Query, sql: str) -> list[dict[str, Any]]:
    columns, rows = query(sql)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _count_rows(query: Query, tables: Sequence[str]) -> dict[str, int]:
    return {name: int(query(f"SELECT count(*) FROM {quote_name(name)}")[1][0][0]) for name in sorted(tables)}


def read_revision(query: Query) -> str | None:
    """The Alembic revision the catalog's `alembic_version` table records (None: none)."""
    versions = sorted(str(row[0]) for row in query("SELECT version_num FROM alembic_version")[1])
    return ",".join(versions) or None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def read_state(query: Query, table_names: Sequence[str]) -> CatalogState:
    """The revision, row counts and blob references, each read through `query` (one snapshot).

    Engines: every row with a sha256, except those whose blob_path gc cleared (a RETIRED engine whose
    blob was collected: the catalog says it has none), and each file of an engine bundle. Models:
    every row. Jobs: the digests their payloads name. Runtime caches: the blobs their rows name. The
    audit chain's head (revision 0017 on), as `details["audit_head"]` (`id`, `hash`), which the
    manifest records: a head kept outside the catalog."""
    tables = _count_rows(query, table_names)
    state = CatalogState(read_revision(query) if "alembic_version" in tables else None, tables)
    if "engines" in tables:
        # every column: `provenance` (revision 0018 on) lists an engine bundle's files, blobs of their own
        for row in _rows(query, "SELECT * FROM engines WHERE sha256 IS NOT NULL ORDER BY id"):
            if row["blob_path"] is not None or row["status"] == EngineStatus.READY:
                bundle = (_json(row.get("provenance")) or {}).get("bundle") or {}
                for digest in (str(row["sha256"]), *sorted(str(d) for d in bundle.get("blobs") or ())):
                    state.engines.append(EngineRef(int(row["id"]), str(row["status"]), digest))
    if "models" in tables:
        for row in _rows(query, "SELECT * FROM models ORDER BY id"):
            info = _json(row["info"]) or {}
            external = tuple(str(name) for name in info.get("external_data_files") or ())
            status = str(row.get("status") or "OK")
            state.models.append(ModelRef(int(row["id"]), str(row["digest"]), str(row["filename"]), external, status))
    if "jobs" in tables:
        for row in _rows(query, "SELECT id, payload FROM jobs ORDER BY id"):
            for digest in sorted(set(payload_digests(_json(row["payload"])))):
                state.job_blobs.setdefault(digest, []).append(int(row["id"]))
    if "runtime_caches" in tables:  # TensorRT-RTX runtime caches (revision 0021 on)
        for row in _rows(query, "SELECT id, sha256 FROM runtime_caches ORDER BY id"):
            state.runtime_cache_blobs.setdefault(str(row["sha256"]), []).append(int(row["id"]))
    if HEAD_TABLE in tables:
        for row in _rows(query, f"SELECT last_id, last_hash FROM {HEAD_TABLE}"):
            last_id = None if row["last_id"] is None else int(row["last_id"])
            state.details["audit_head"] = {"id": last_id, "hash": str(row["last_hash"])}
    return state


def check_references(state: CatalogState, blobs: set[str], models: set[str], where: str) -> None:
    """Every READY engine's blob and every model's bundle (but a CORRUPT model's) of a restored catalog
    is among what was restored; IntegrityCheckError naming the first that is not."""
    for engine in state.engines:
        if engine.status == EngineStatus.READY and engine.sha256 not in blobs:
            raise IntegrityCheckError(
                f"{where}: READY engine {engine.engine_id} references blob {engine.sha256}, "
                "which the backup's manifest does not list"
            )
    for model in state.models:
        if model.status != CORRUPT and model.digest not in models:
            raise IntegrityCheckError(
                f"{where}: model {model.model_id} ({model.digest}) has no bundle in the backup's manifest"
            )
