"""The SQLite catalog's backup and restore: the stdlib's online backup API (`sqlite3.Connection.backup`)
in one step, which copies every page inside one read transaction (WAL: writers go on meanwhile), into
a file switched to the rollback journal (one self-contained file); its references are read from that
copy. A restore checks the copied file (PRAGMA integrity_check) and reads what it holds; it writes a
new file, never over one that exists."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from enginecache.db.reader import SQLITE_TIMEOUT_SECONDS
from enginecache.errors import BackupRefusedError, IntegrityCheckError
from enginecache.service.maintenance.backup.database import CatalogState, Query, read_state


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
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        return "; ".join(str(row[0]) for row in connection.execute("PRAGMA integrity_check"))


def read_sqlite_state(path: Path) -> CatalogState:
    with closing(sqlite3.connect(path, timeout=SQLITE_TIMEOUT_SECONDS, isolation_level=None)) as connection:
        connection.execute("BEGIN")
        try:
            return read_state(_sqlite_query(connection), _sqlite_tables(connection))
        finally:
            connection.execute("ROLLBACK")


def require_integrity(path: Path, what: str) -> None:
    verdict = sqlite_integrity(path)
    if verdict != "ok":
        raise IntegrityCheckError(f"{what} ({path}) fails PRAGMA integrity_check: {verdict}")


def self_contained(path: Path) -> None:
    """Switch a SQLite file to the rollback journal, so it is one file (no -wal beside it) that can
    be moved; a catalog opened on it later switches it back to WAL."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        connection.execute("PRAGMA journal_mode=DELETE")


def sqlite_snapshot(source: Path, dest: Path) -> CatalogState:
    """Copy the live SQLite catalog `source` into the new file `dest` with the online backup API (one
    step: one read transaction, so one consistent state while writers go on), then read the copy."""
    if not source.is_file():
        raise BackupRefusedError(f"there is no SQLite catalog at {source}")
    with (
        closing(sqlite3.connect(source, timeout=SQLITE_TIMEOUT_SECONDS, isolation_level=None)) as live,
        closing(sqlite3.connect(dest, isolation_level=None)) as copy,
    ):
        live.backup(copy)  # pages=-1: every page in one step
        copy.execute("PRAGMA journal_mode=DELETE")
    require_integrity(dest, "the catalog copy")
    state = read_sqlite_state(dest)
    state.details["integrity_check"] = "ok"
    return state


def restore_sqlite(path: Path) -> CatalogState:
    """Check a restored SQLite file (integrity) and read what it holds."""
    require_integrity(path, "the backup's catalog")
    return read_sqlite_state(path)


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
