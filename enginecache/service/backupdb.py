"""The catalog's half of backup and restore: a consistent copy of the database taken while others
write, what that copy references, and putting a copy back.

- SQLite: the stdlib's online backup API (`sqlite3.Connection.backup`) in one step, which copies
  every page inside one read transaction (WAL: writers go on meanwhile), into a file switched to
  the rollback journal (one self-contained file); its references are read from that copy.
- PostgreSQL: one REPEATABLE READ, READ ONLY transaction exports its snapshot
  (`pg_export_snapshot()`); `pg_dump --snapshot` dumps exactly that snapshot (custom format) while
  the same transaction reads the references and row counts. The dump and the blob list are the same
  state of the database, whatever commits or is collected meanwhile.
- Restore: SQLite copies the file; PostgreSQL runs `pg_restore --single-transaction` (all or
  nothing) into a database without rows. Then the schema is brought to the head revision.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import subprocess
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from enginecache.db.catalog import MIGRATIONS_DIR, Catalog, head_revision, normalize_url
from enginecache.db.models import EngineStatus
from enginecache.db.reader import SQLITE_TIMEOUT_SECONDS
from enginecache.errors import BackupRefusedError, BackupToolError, IntegrityCheckError

SQLITE = "sqlite"
POSTGRESQL = "postgresql"
CORRUPT = "CORRUPT"  # a model's status once its stored bundle no longer hashed to its digest
PG_LOCK_WAIT_MS = 60_000  # pg_dump gives up instead of queueing behind a migration's lock forever

# One query on a catalog connection: SQL in; the result's column names and rows out.
Query = Callable[[str], tuple[list[str], Sequence[Sequence[Any]]]]

_DIGEST = re.compile(r"[0-9a-f]{64}")


def is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


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
    details: dict[str, Any] = field(default_factory=dict)


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


# -- reading a snapshot --------------------------------------------------------------------------


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _rows(query: Query, sql: str) -> list[dict[str, Any]]:
    columns, rows = query(sql)
    return [dict(zip(columns, row, strict=True)) for row in rows]


def _count_rows(query: Query, tables: Sequence[str]) -> dict[str, int]:
    return {name: int(query(f"SELECT count(*) FROM {_quote(name)}")[1][0][0]) for name in sorted(tables)}


def _revision(query: Query, tables: dict[str, int]) -> str | None:
    if "alembic_version" not in tables:
        return None
    versions = sorted(str(row[0]) for row in query("SELECT version_num FROM alembic_version")[1])
    return ",".join(versions) or None


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _payload_digests(value: Any) -> set[str]:
    """The blob digests a job payload names (a calibration file, test-load inputs): every string in it
    that is a digest or a path whose last part is one. Some may name no blob (a model digest)."""
    if isinstance(value, str):
        name = value.rsplit("/", 1)[-1]
        return {name} if is_digest(name) else set()
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return {digest for item in items for digest in _payload_digests(item)}


def read_state(query: Query, table_names: Sequence[str]) -> CatalogState:
    """The revision, row counts and blob references, each read through `query` (one snapshot).

    Engines: every row with a sha256, except those whose blob_path gc cleared (a RETIRED engine whose
    blob was collected: the catalog says it has none). Models: every row. Jobs: the digests their
    payloads name."""
    tables = _count_rows(query, table_names)
    state = CatalogState(_revision(query, tables), tables)
    if "engines" in tables:
        for row in _rows(
            query, "SELECT id, status, sha256, blob_path FROM engines WHERE sha256 IS NOT NULL ORDER BY id"
        ):
            if row["blob_path"] is not None or row["status"] == EngineStatus.READY:
                state.engines.append(EngineRef(int(row["id"]), str(row["status"]), str(row["sha256"])))
    if "models" in tables:
        for row in _rows(query, "SELECT * FROM models ORDER BY id"):
            info = _json(row["info"]) or {}
            external = tuple(str(name) for name in info.get("external_data_files") or ())
            status = str(row.get("status") or "OK")
            state.models.append(ModelRef(int(row["id"]), str(row["digest"]), str(row["filename"]), external, status))
    if "jobs" in tables:
        for row in _rows(query, "SELECT id, payload FROM jobs ORDER BY id"):
            for digest in sorted(_payload_digests(_json(row["payload"]))):
                state.job_blobs.setdefault(digest, []).append(int(row["id"]))
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


# -- SQLite ----------------------------------------------------------------------------------


def _sqlite_query(connection: sqlite3.Connection) -> Query:
    def query(sql: str) -> tuple[list[str], list[Any]]:
        cursor = connection.execute(sql)
        return [str(column[0]) for column in cursor.description or ()], cursor.fetchall()

    return query


def _sqlite_tables(connection: sqlite3.Connection) -> list[str]:
    rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
    return [str(row[0]) for row in rows]


def sqlite_integrity(path: Path) -> str:
    """`PRAGMA integrity_check` of a SQLite file: "ok", or its findings on one line."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        return "; ".join(str(row[0]) for row in connection.execute("PRAGMA integrity_check"))
    finally:
        connection.close()


def read_sqlite_state(path: Path) -> CatalogState:
    connection = sqlite3.connect(path, timeout=SQLITE_TIMEOUT_SECONDS, isolation_level=None)
    try:
        connection.execute("BEGIN")
        try:
            return read_state(_sqlite_query(connection), _sqlite_tables(connection))
        finally:
            connection.execute("ROLLBACK")
    finally:
        connection.close()


def require_integrity(path: Path, what: str) -> None:
    verdict = sqlite_integrity(path)
    if verdict != "ok":
        raise IntegrityCheckError(f"{what} ({path}) fails PRAGMA integrity_check: {verdict}")


def self_contained(path: Path) -> None:
    """Switch a SQLite file to the rollback journal, so it is one file (no -wal beside it) that can
    be moved; a catalog opened on it later switches it back to WAL."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=DELETE")
    finally:
        connection.close()


def sqlite_snapshot(source: Path, dest: Path) -> CatalogState:
    """Copy the live SQLite catalog `source` into the new file `dest` with the online backup API (one
    step: one read transaction, so one consistent state while writers go on), then read the copy."""
    if not source.is_file():
        raise BackupRefusedError(f"there is no SQLite catalog at {source}")
    live = sqlite3.connect(source, timeout=SQLITE_TIMEOUT_SECONDS, isolation_level=None)
    try:
        copy = sqlite3.connect(dest, isolation_level=None)
        try:
            live.backup(copy)  # pages=-1: every page in one step
            copy.execute("PRAGMA journal_mode=DELETE")
        finally:
            copy.close()
    finally:
        live.close()
    require_integrity(dest, "the catalog copy")
    state = read_sqlite_state(dest)
    state.details["integrity_check"] = "ok"
    return state


def restore_sqlite(path: Path) -> CatalogState:
    """Check a restored SQLite file (integrity) and read what it holds."""
    require_integrity(path, "the backup's catalog")
    return read_sqlite_state(path)


# -- PostgreSQL ------------------------------------------------------------------------------


def _conn_query(connection: sa.Connection) -> Query:
    def query(sql: str) -> tuple[list[str], list[Any]]:
        result = connection.exec_driver_sql(sql)
        return list(result.keys()), list(result.all())

    return query


def _pg_tables(connection: sa.Connection) -> list[tuple[str, str]]:
    rows = connection.exec_driver_sql(
        "SELECT table_schema, table_name FROM information_schema.tables "
        "WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ('pg_catalog', 'information_schema') "
        "AND table_schema !~ '^pg_' ORDER BY 1, 2"
    )
    return [(str(schema), str(name)) for schema, name in rows]


def _current_schema_tables(connection: sa.Connection) -> list[str]:
    schema = connection.exec_driver_sql("SELECT current_schema()").scalar()
    return [name for table_schema, name in _pg_tables(connection) if table_schema == schema]


def find_tool(name: str, pg_bin: Path | None) -> Path:
    """The PostgreSQL client program `name`, in `pg_bin` where given, else on PATH."""
    found = shutil.which(name, path=str(pg_bin) if pg_bin is not None else None)
    if found is None:
        where = str(pg_bin) if pg_bin is not None else "PATH"
        raise BackupToolError(
            f"{name} is not in {where}: install the PostgreSQL client programs (the server's major version "
            "or newer), or name their folder with --pg-bin"
        )
    return Path(found)


def tool_version(tool: Path) -> tuple[int, str]:
    """(major, full version) of a PostgreSQL client program, from its `--version`."""
    done = subprocess.run([str(tool), "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"\s(\d+)((?:\.\d+)*)", done.stdout)
    if done.returncode != 0 or found is None:
        raise BackupToolError(f"{tool} --version failed: {(done.stdout + done.stderr).strip()}")
    return int(found.group(1)), found.group(1) + found.group(2)


def _libpq(catalog: Catalog) -> tuple[str, dict[str, str]]:
    """The catalog's connection as a libpq conninfo string for the client programs (what the catalog's
    own driver connects with), and their environment: the password goes in PGPASSWORD, never on a
    command line."""
    from psycopg.conninfo import make_conninfo

    _args, params = catalog.engine.dialect.create_connect_args(catalog.engine.url)
    options = {key: str(value) for key, value in params.items() if isinstance(value, (str, int)) and key != "password"}
    env = dict(os.environ)
    password = params.get("password")
    if password:
        env["PGPASSWORD"] = str(password)
    return make_conninfo("", **options), env


def _run_tool(command: list[str], env: dict[str, str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        words = " ".join((done.stderr or done.stdout).split())[-2000:]
        raise BackupToolError(f"{what} failed (exit status {done.returncode}): {words}")


def _server_major(connection: sa.Connection) -> tuple[int, str]:
    number = int(connection.exec_driver_sql("SHOW server_version_num").scalar() or 0)
    version = str(connection.exec_driver_sql("SHOW server_version").scalar())
    return number // 10000, version.split()[0]


def postgres_snapshot(url: str, dest: Path, pg_bin: Path | None) -> CatalogState:
    """`pg_dump` (custom format) of the catalog into `dest`, and the references of the very snapshot
    it dumps: one REPEATABLE READ, READ ONLY transaction exports its snapshot, pg_dump imports it
    (`--snapshot`), and the same transaction reads the rows, so writers and collectors going on
    meanwhile change neither."""
    pg_dump = find_tool("pg_dump", pg_bin)
    dump_major, dump_version = tool_version(pg_dump)
    catalog = Catalog(url, migrate=False)
    try:
        conninfo, env = _libpq(catalog)
        with catalog.connect() as connection:
            connection.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
            with connection.begin():
                server_major, server_version = _server_major(connection)
                if dump_major < server_major:
                    raise BackupToolError(
                        f"{pg_dump} is version {dump_version}, older than the catalog's server ({server_version}): "
                        "pg_dump must be of the server's major version or newer (--pg-bin names another folder)"
                    )
                snapshot = str(connection.exec_driver_sql("SELECT pg_export_snapshot()").scalar())
                state = read_state(_conn_query(connection), _current_schema_tables(connection))
                _run_tool(
                    [
                        str(pg_dump),
                        "--format=custom",
                        f"--snapshot={snapshot}",
                        f"--lock-wait-timeout={PG_LOCK_WAIT_MS}",
                        "--no-password",
                        f"--file={dest}",
                        f"--dbname={conninfo}",
                    ],
                    env,
                    "pg_dump",
                )
    finally:
        catalog.dispose()
    state.details.update(
        server_version=server_version,
        pg_dump_version=dump_version,
        pg_dump_major=dump_major,
        snapshot="pg_export_snapshot(): pg_dump --snapshot and the blob list read one snapshot",
    )
    return state


@contextlib.contextmanager
def _pg_transaction(url: str) -> Iterator[tuple[Catalog, sa.Connection]]:
    catalog = Catalog(url, migrate=False)
    try:
        with catalog.connect() as connection, connection.begin():
            yield catalog, connection
    finally:
        catalog.dispose()


def prepare_postgres_target(url: str, backup_tables: Collection[str], *, drop: bool) -> None:
    """Refuse a target database that has rows, or tables the backup does not hold. With `drop`, the
    backup's own tables found there empty (a catalog opened but never written) are dropped, under an
    exclusive lock after checking again that they are empty, so pg_restore can create them."""
    with _pg_transaction(url) as (catalog, connection):
        schema = connection.exec_driver_sql("SELECT current_schema()").scalar()
        found = _pg_tables(connection)
        names = [f"{_quote(s)}.{_quote(n)}" for s, n in found]
        if drop and names:
            connection.exec_driver_sql(f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE")
        with_rows = [  # the schema's own revision row is no data: an opened, never written catalog has it
            f"{s}.{n}"
            for (s, n), quoted in zip(found, names, strict=True)
            if n != "alembic_version" and connection.exec_driver_sql(f"SELECT EXISTS (SELECT 1 FROM {quoted})").scalar()
        ]
        if with_rows:
            raise BackupRefusedError(
                f"the catalog at {catalog.safe_url} already has rows (in {', '.join(with_rows)}): "
                "restore only into an empty database"
            )
        foreign = [f"{s}.{n}" for s, n in found if s != schema or n not in backup_tables]
        if foreign:
            raise BackupRefusedError(
                f"the database at {catalog.safe_url} is not empty: it has tables the backup does not hold "
                f"({', '.join(foreign)}); restore into an empty database"
            )
        if drop and names:
            connection.exec_driver_sql(f"DROP TABLE {', '.join(names)} CASCADE")
            _drop_catalog_functions(connection)


def drop_tables(url: str, tables: Collection[str]) -> None:
    """Drop the named tables of the current schema where they exist: what a restore created, once a
    later step failed (the database was empty before it)."""
    if not tables:
        return
    with _pg_transaction(url) as (_catalog, connection):
        connection.exec_driver_sql(f"DROP TABLE IF EXISTS {', '.join(_quote(name) for name in sorted(tables))} CASCADE")
        _drop_catalog_functions(connection)


# Functions the catalog's migrations create (0010: the audit log's append-only trigger function):
# dropping the tables leaves them, and pg_restore would then fail to create them again.
CATALOG_FUNCTIONS = ("audit_events_append_only()",)


def _drop_catalog_functions(connection: Any) -> None:
    for function in CATALOG_FUNCTIONS:
        connection.exec_driver_sql(f"DROP FUNCTION IF EXISTS {function}")


def restore_postgres(url: str, dump: Path, pg_bin: Path | None, *, archive_major: int | None) -> CatalogState:
    """`pg_restore` the dump into the (prepared, empty) target in one transaction: all of it or
    nothing. Returns what the restored catalog holds."""
    pg_restore = find_tool("pg_restore", pg_bin)
    major, version = tool_version(pg_restore)
    if archive_major is not None and major < archive_major:
        raise BackupToolError(
            f"{pg_restore} is version {version}; the backup was written by pg_dump {archive_major}, "
            "which only pg_restore of that major version or newer reads (--pg-bin names another folder)"
        )
    catalog = Catalog(url, migrate=False)
    try:
        conninfo, env = _libpq(catalog)
    finally:
        catalog.dispose()
    command = [
        str(pg_restore),
        "--single-transaction",
        "--exit-on-error",
        "--no-owner",
        "--no-privileges",
        "--no-password",
        f"--dbname={conninfo}",
        str(dump),
    ]
    _run_tool(command, env, "pg_restore")
    with _pg_transaction(url) as (_catalog, connection):
        return read_state(_conn_query(connection), _current_schema_tables(connection))


def check_sqlite_target(path: Path) -> None:
    """A restore writes a new SQLite file: refuse one that exists, saying whether it has rows."""
    if not path.exists():
        return
    try:
        state = read_sqlite_state(path)
    except sqlite3.DatabaseError as err:
        raise BackupRefusedError(f"{path} already exists (and is not a readable catalog: {err})") from err
    rows = {name: count for name, count in state.tables.items() if count and name != "alembic_version"}
    held = f" and has rows ({', '.join(f'{n}: {c}' for n, c in rows.items())})" if rows else " (with no rows)"
    raise BackupRefusedError(
        f"the catalog file {path} already exists{held}: a restore writes a new catalog; "
        "restore into an empty home, or remove the file first if it holds nothing you need"
    )


def migrate_to_head(url: str) -> str | None:
    """Bring a restored catalog to the head revision; returns the revision it is at."""
    catalog = Catalog(url, migrate=False)
    try:
        # Not Catalog.migrate(): it runs once per URL and process, and this process may have opened
        # the target database (and remembered it as current) before the restore put an older schema there.
        if not catalog._at_head():
            catalog._upgrade()
        with catalog.connect() as connection:
            versions = sorted(
                str(row[0]) for row in connection.exec_driver_sql("SELECT version_num FROM alembic_version")
            )
    finally:
        catalog.dispose()
    return ",".join(versions) or None


def known_revision(revision: str | None) -> bool:
    """Whether a backup's schema revision is one of this version's migrations (None: no schema yet)."""
    if revision is None or revision == head_revision():
        return True
    from alembic.script import ScriptDirectory

    known = {script.revision for script in ScriptDirectory(str(MIGRATIONS_DIR)).walk_revisions()}
    return all(part in known for part in revision.split(","))
