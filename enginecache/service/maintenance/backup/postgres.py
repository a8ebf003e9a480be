"""The PostgreSQL catalog's backup and restore. Backup: one REPEATABLE READ, READ ONLY transaction
exports its snapshot (`pg_export_snapshot()`); `pg_dump --snapshot` dumps exactly that snapshot
(custom format) while the same transaction reads the references and row counts, so the dump and the
blob list are the same state of the database, whatever commits or is collected meanwhile. Restore:
`pg_restore --single-transaction` (all or nothing) into a database without rows, and dropping what
it created again when a later step fails. The client programs are service.maintenance.backup.pgclient's."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from enginecache.db.auditchain import HEAD_TABLE
from enginecache.db.catalog import Catalog
from enginecache.errors import BackupRefusedError, BackupToolError
from enginecache.service.maintenance.backup.database import (
    CatalogState,
    connection_query,
    open_catalog,
    quote_name,
    read_state,
)
from enginecache.service.maintenance.backup.pgclient import find_tool, libpq, run_tool, tool_version

PG_LOCK_WAIT_MS = 60_000  # pg_dump gives up instead of queueing behind a migration's lock forever

# Functions the catalog's migrations create (0010: the audit log's append-only trigger function):
# dropping the tables leaves them, and pg_restore would then fail to create them again.
CATALOG_FUNCTIONS = ("audit_events_append_only()",)


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
    with open_catalog(url) as catalog:
        conninfo, env = libpq(catalog)
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
                state = read_state(connection_query(connection), _current_schema_tables(connection))
                run_tool(
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
    state.details.update(
        server_version=server_version,
        pg_dump_version=dump_version,
        pg_dump_major=dump_major,
        snapshot="pg_export_snapshot(): pg_dump --snapshot and the blob list read one snapshot",
    )
    return state


@contextlib.contextmanager
def _pg_transaction(url: str) -> Iterator[tuple[Catalog, sa.Connection]]:
    with open_catalog(url) as catalog, catalog.connect() as connection, connection.begin():
        yield catalog, connection


def prepare_postgres_target(url: str, backup_tables: Collection[str], *, drop: bool) -> None:
    """Refuse a target database that has rows, or tables the backup does not hold. With `drop`, the
    backup's own tables found there empty (a catalog opened but never written) are dropped, under an
    exclusive lock after checking again that they are empty, so pg_restore can create them."""
    with _pg_transaction(url) as (catalog, connection):
        schema = connection.exec_driver_sql("SELECT current_schema()").scalar()
        found = _pg_tables(connection)
        names = [f"{quote_name(s)}.{quote_name(n)}" for s, n in found]
        if drop and names:
            connection.exec_driver_sql(f"LOCK TABLE {', '.join(names)} IN ACCESS EXCLUSIVE MODE")
        # The schema's own revision row and an empty audit chain's head are no data: an opened, never
        # written catalog has them.
        data = {"alembic_version": "FALSE", HEAD_TABLE: "last_id IS NOT NULL"}
        with_rows = [
            f"{s}.{n}"
            for (s, n), quoted in zip(found, names, strict=True)
            if connection.exec_driver_sql(
                f"SELECT EXISTS (SELECT 1 FROM {quoted} WHERE {data.get(n, 'TRUE')})"
            ).scalar()
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
        connection.exec_driver_sql(
            f"DROP TABLE IF EXISTS {', '.join(quote_name(name) for name in sorted(tables))} CASCADE"
        )
        _drop_catalog_functions(connection)


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
    with open_catalog(url) as catalog:
        conninfo, env = libpq(catalog)
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
    run_tool(command, env, "pg_restore")
    with _pg_transaction(url) as (_catalog, connection):
        return read_state(connection_query(connection), _current_schema_tables(connection))
