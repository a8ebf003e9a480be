"""One way to run the catalog's hand-written SQL on either kind of connection.

SQL given to an executor uses named `:param` marks, which the stdlib's `sqlite3` and SQLAlchemy's
`text()` both accept, and the subset of SQL that SQLite and PostgreSQL share. An executor runs each
statement in the transaction its connection is in; it never begins, commits or rolls back one of
its own (`SqliteWrite` does that for a stdlib connection; a SQLAlchemy caller has its session's).

- `SqliteExecutor`: a stdlib `sqlite3` connection (a serving process's cache hit, which imports
  neither SQLAlchemy nor `typing`).
- `AlchemyExecutor`: a SQLAlchemy `Connection` (any database; `db.catalog.Catalog.changes()` gives
  one in a write transaction).

Values are bound as each database stores them: JSON as its text (`json_text`), a timestamp
as SQLAlchemy's `db.types.UTCDateTime` stores it (`timestamp`): naive UTC text on SQLite, an
aware datetime on PostgreSQL.
"""

from __future__ import annotations

import json
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Mapping
    from datetime import datetime
    from types import TracebackType
    from typing import Any, Protocol

    import sqlalchemy as sa

    class Executor(Protocol):
        """Runs one statement in the connection's current transaction."""

        def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
            """The rows a SELECT (or a statement with RETURNING) answers."""

        def run(self, sql: str, params: Mapping[str, Any]) -> int:
            """Runs a statement; the number of rows it changed."""

        def timestamp(self, value: datetime | None = None) -> Any:
            """`value` (default: now) as this database stores a `UTCDateTime` column."""


SQLITE_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # SQLAlchemy's SQLite DateTime, microseconds appended


def json_text(value: Any) -> str:
    """A JSON column's value as text: what SQLAlchemy's `JSON` type writes (the same on PostgreSQL,
    where the server parses it)."""
    return json.dumps(value)


def sqlite_now() -> str:
    """Now in UTC as SQLAlchemy's SQLite DateTime stores it (naive UTC, microseconds), from `time`
    alone."""
    seconds, nanoseconds = divmod(time.time_ns(), 1_000_000_000)
    return time.strftime(SQLITE_TIME_FORMAT, time.gmtime(seconds)) + f".{nanoseconds // 1000:06d}"


def sqlite_time(value: datetime) -> str:
    """An aware datetime as SQLAlchemy's SQLite DateTime stores it (naive UTC)."""
    from datetime import UTC

    if value.tzinfo is None:
        raise ValueError("naive datetime given to a UTC column; use datetime.now(UTC)")
    return value.astimezone(UTC).strftime(SQLITE_TIME_FORMAT + ".%f")


class SqliteExecutor:
    """An `Executor` on a stdlib `sqlite3` connection."""

    __slots__ = ("connection",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        return self.connection.execute(sql, params).fetchall()

    def run(self, sql: str, params: Mapping[str, Any]) -> int:
        return self.connection.execute(sql, params).rowcount

    def timestamp(self, value: datetime | None = None) -> Any:
        return sqlite_now() if value is None else sqlite_time(value)


class SqliteWrite:
    """`with SqliteWrite(connection) as executor:` one immediate write transaction on an autocommit
    stdlib connection (`isolation_level=None`), committed when the block ends, rolled back when it
    raises."""

    __slots__ = ("connection",)

    def __init__(self, connection: sqlite3.Connection) -> None:
        self.connection = connection

    def __enter__(self) -> SqliteExecutor:
        self.connection.execute("BEGIN IMMEDIATE")
        return SqliteExecutor(self.connection)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.connection.execute("COMMIT" if kind is None else "ROLLBACK")


class AlchemyExecutor:
    """An `Executor` on a SQLAlchemy connection (a session's: `session.connection()`)."""

    __slots__ = ("_sqlite", "connection")

    def __init__(self, connection: sa.Connection) -> None:
        self.connection = connection
        self._sqlite = connection.dialect.name == "sqlite"

    def rows(self, sql: str, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        import sqlalchemy as sa

        return [tuple(row) for row in self.connection.execute(sa.text(sql), dict(params))]

    def run(self, sql: str, params: Mapping[str, Any]) -> int:
        import sqlalchemy as sa

        return int(self.connection.execute(sa.text(sql), dict(params)).rowcount)

    def timestamp(self, value: datetime | None = None) -> Any:
        if value is None:
            from datetime import UTC, datetime

            value = datetime.now(UTC)
        if self._sqlite:
            return sqlite_time(value)
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(UTC)")
        return value
