"""Reading the catalog without SQLAlchemy: what a read command needs to start in a fraction of a second.

SQLAlchemy's import alone (about 0.2 s) is most of what a read command may cost in a new process, so
the CLI's listings and `show` views go through a `RowSource`: plain SQL (named `:params`, the subset
SQLite and PostgreSQL share) and the kind of each selected column, answering tuples of decoded values.

- `SqliteReader` is one, on the stdlib `sqlite3` for a plain `sqlite:///FILE` catalog that exists and
  is at the head revision: it decodes what SQLAlchemy stored (JSON text, naive UTC timestamps, 0/1) as
  SQLAlchemy would. Anything else (another URL form, a missing file, an older schema) is None, and the
  caller takes the SQLAlchemy path (`db.catalog.Catalog`), which creates, migrates and maps errors.
- `db.catalog.Catalog.rows` is the other (any database, with SQLAlchemy's own types).

Where the catalog is and whether its schema is current is `db.catalogfile`'s answer (`head_revision`
and the SQLite URL helpers are re-exported here); how each column decodes is `db.columns.COLUMN_KINDS`.
"""

from __future__ import annotations

import abc
import os
import sqlite3
from typing import TYPE_CHECKING

from enginecache.db.catalogfile import REVISION_SQL, is_head
from enginecache.db.catalogfile import head_revision as head_revision  # re-exported, as the two below
from enginecache.db.catalogfile import sqlite_file as sqlite_file
from enginecache.db.catalogfile import sqlite_url as sqlite_url
from enginecache.db.columns import COLUMN_KINDS as COLUMN_KINDS  # re-exported: the kinds rows decode by
from enginecache.db.columns import DECODERS

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from typing import Any

SQLITE_TIMEOUT_SECONDS = 30.0  # as db.catalog's busy timeout
FETCH_ROWS = 1000  # rows fetched from the cursor at a time

# One selected column: its name in the result and its kind (a COLUMN_KINDS value).
Column = tuple[str, str]


def paged(
    sql: str, params: Mapping[str, Any], limit: int | None, offset: int, *, no_limit: int | None
) -> tuple[str, Mapping[str, Any]]:
    """`sql` and `params` with LIMIT/OFFSET bound where a page is asked for; without a limit the
    LIMIT is `no_limit` (-1 on SQLite, None on PostgreSQL: LIMIT NULL)."""
    if limit is None and not offset:
        return sql, params
    page = {"_limit": no_limit if limit is None else limit, "_offset": offset}
    return sql + " LIMIT :_limit OFFSET :_offset", {**params, **page}


class RowSource(abc.ABC):
    """Runs one SELECT and yields its rows, decoded, as the database delivers them (in batches).

    `rows` binds the page (`paged`); a source says how a statement runs (`_select`) and what LIMIT
    stands for "no limit" on its database (`_no_limit`: -1 on SQLite)."""

    def rows(
        self,
        sql: str,
        params: Mapping[str, Any],
        columns: Sequence[Column],
        *,
        limit: int | None = None,
        offset: int = 0,
    ) -> Iterator[tuple[Any, ...]]:
        sql, params = paged(sql, params, limit, offset, no_limit=self._no_limit())
        yield from self._select(sql, params, columns)

    def _no_limit(self) -> int | None:
        return -1

    @abc.abstractmethod
    def _select(self, sql: str, params: Mapping[str, Any], columns: Sequence[Column]) -> Iterator[tuple[Any, ...]]:
        """The rows of `sql` (already paged), each column decoded by its kind."""


def columns_of(table: str, names: Sequence[str] | None = None, *, prefix: str = "") -> list[Column]:
    """(name, kind) of `names` (default: every column listed) of `table`, optionally renamed
    `prefix + name`."""
    kinds = COLUMN_KINDS[table]
    return [(prefix + name, kinds[name]) for name in (names if names is not None else list(kinds))]


# -- SQLite with the stdlib -----------------------------------------------------------------


class SqliteReader(RowSource):
    """A read connection to a SQLite catalog file with the stdlib alone; every statement of one reader
    reads one snapshot (one deferred transaction, rolled back on close)."""

    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    @classmethod
    def open(cls, url: str) -> SqliteReader | None:
        """A reader where `url` is a plain SQLite URL of an existing file whose schema is at the head
        revision; None otherwise (the caller opens the catalog with SQLAlchemy, which migrates)."""
        path = sqlite_file(url)
        if path is None or head_revision() is None or not os.path.isfile(path):
            return None
        try:
            connection = sqlite3.connect(path, timeout=SQLITE_TIMEOUT_SECONDS, isolation_level=None)
        except sqlite3.Error:
            return None
        try:
            connection.execute("BEGIN")
            current = is_head(row[0] for row in connection.execute(REVISION_SQL))
        except sqlite3.Error:
            connection.close()
            return None
        if not current:
            connection.close()
            return None
        return cls(connection)

    def _select(self, sql: str, params: Mapping[str, Any], columns: Sequence[Column]) -> Iterator[tuple[Any, ...]]:
        cursor = self._connection.execute(sql, dict(params))
        decoders = [(i, DECODERS[kind]) for i, (_, kind) in enumerate(columns) if kind]
        while batch := cursor.fetchmany(FETCH_ROWS):
            if not decoders:
                yield from batch
                continue
            for raw in batch:
                row = list(raw)
                for i, decode in decoders:
                    row[i] = decode(row[i])
                yield tuple(row)

    def close(self) -> None:
        try:
            self._connection.rollback()
        finally:
            self._connection.close()
