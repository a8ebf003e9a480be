"""Opening the catalog: engine settings per database, migrations, read and write sessions.

SQLite: WAL, synchronous=FULL, busy_timeout, foreign keys, and `BEGIN IMMEDIATE` for write
sessions (so two writers never deadlock upgrading a read lock). PostgreSQL through a URL.

Opening costs one query when the schema is current: the `alembic_version` row is compared with the
head revision read from the migration files (`head_revision`, no Alembic import); Alembic, and the
SQLModel tables its environment loads, are imported only to migrate. SQLModel's `Session` is
imported by the first `read()`/`write()`; `connect()` is plain SQLAlchemy Core (the CLI's read
commands use nothing else, so they start without SQLModel).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy import event

from enginecache.db.catalogfile import REVISION_SQL, is_head
from enginecache.db.reader import Column, RowSource, head_revision, sqlite_url
from enginecache.db.sqlexec import AlchemyExecutor
from enginecache.db.types import UTCDateTime
from enginecache.errors import CatalogUnavailableError, EngineCacheError

if TYPE_CHECKING:
    from sqlmodel import Session

logger = logging.getLogger(__name__)

__all__ = ["Catalog", "CatalogConnectError", "ConnectionRows", "head_revision", "normalize_url", "sqlite_url"]

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
MIGRATION_LOCK_KEY = 0x656E67696E65  # "engine": the advisory lock migrations hold on PostgreSQL
_MIGRATE_LOCK = threading.Lock()
_MIGRATED: set[str] = set()
# libpq settings for a catalog across a network. Without them a connect that gets no answer, or a
# connection whose peer is gone without a word (a cut link drops packets: no RST), waits on the
# kernel's TCP retries, about 15 minutes, with the worker's heartbeat or a serving start stuck in it.
# With them a connect fails after 10 s and a dead connection after about 30 s, as an OperationalError
# the callers ride out (the worker retries; its lease lapses meanwhile and another host takes over).
# A URL's own query parameters (`?connect_timeout=...`) win.
PG_NETWORK_DEFAULTS: dict[str, str] = {
    "connect_timeout": "10",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "30000",  # ms: unacknowledged data for this long ends the connection
}


def normalize_url(url: str) -> str:
    """Use psycopg (v3) for plain `postgresql://` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


# Connection parameters that carry a secret (libpq's conninfo keywords), wherever a URL puts them.
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def safe_url(url: str) -> str:
    """The catalog URL as it may be shown, logged and recorded: its password and every query
    parameter that carries a secret (`?password=...`, libpq's `sslpassword`) replaced by ***."""
    parsed = sa.engine.make_url(normalize_url(url))
    hidden = {name: "***" for name in parsed.query if name.lower() in SECRET_PARAMETERS}
    shown = parsed.update_query_dict(hidden) if hidden else parsed
    return shown.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")


def pg_network_args(url: str) -> dict[str, str]:
    """`PG_NETWORK_DEFAULTS` less the ones `url` sets itself."""
    given = sa.engine.make_url(url).query
    return {name: value for name, value in PG_NETWORK_DEFAULTS.items() if name not in given}


class CatalogConnectError(CatalogUnavailableError, sa.exc.OperationalError):
    """A connection to the catalog could not be made (server down, refused, file not openable).

    Also an SQLAlchemy OperationalError, so code that rides out an unreachable catalog by catching
    that (the worker's claim, heartbeat and supervision loops) keeps doing so; the CLI maps it to
    exit 3 as a CatalogUnavailableError.
    """

    def __init__(self, message: str, cause: sa.exc.DBAPIError) -> None:
        sa.exc.OperationalError.__init__(
            self,
            cause.statement,
            cause.params,
            cause.orig if cause.orig is not None else cause,
            connection_invalidated=cause.connection_invalidated,
        )
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> Any:  # unpickles as the plain kind (the SQLAlchemy half needs its cause)
        return CatalogUnavailableError, (self.message,)


def _is_connect_failure(err: sa.exc.DBAPIError) -> bool:
    """Raised while connecting, not while a statement ran: SQLAlchemy wraps pool connect errors
    with no statement. SQLite's busy errors ("database is locked") are never counted: they are the
    contention the worker rides out, whatever step they surface in."""
    if err.statement is not None:
        return False
    words = str(err.orig).lower()
    return "locked" not in words and "busy" not in words


def _configure_sqlite(engine: sa.Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: sa.Connection) -> None:
        immediate = connection.get_execution_options().get("sqlite_immediate", False)
        connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


class Catalog:
    """The catalog database: one SQLAlchemy engine plus session helpers."""

    def __init__(self, url: str, *, migrate: bool = True) -> None:
        self.url = normalize_url(url)
        self.is_sqlite = self.url.startswith("sqlite")
        if self.is_sqlite:
            self.engine = sa.create_engine(
                self.url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False}
            )
            _configure_sqlite(self.engine)
            self._writer = self.engine.execution_options(sqlite_immediate=True)
            self._reader = self.engine
        else:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True, connect_args=pg_network_args(self.url))
            self._writer = self.engine.execution_options()
            # Reads run in autocommit: no BEGIN and ROLLBACK round trips around a lookup (a point
            # lookup's cost halves). At READ COMMITTED, PostgreSQL's default, each statement of a
            # transaction takes its own snapshot anyway, so a read loses no consistency by it;
            # `connect()` keeps a transaction, which its server-side cursors need.
            self._reader = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        if migrate:
            self.migrate()

    def migrate(self) -> None:
        """Bring the schema to the newest Alembic revision (once per URL and process).

        Alembic's runtime keeps module-level state, so migrations in one process are serialized
        by a lock; across processes SQLite's immediate transaction and a PostgreSQL advisory
        lock make the second migrator wait and then find the schema current.
        """
        with _MIGRATE_LOCK:
            if self.url in _MIGRATED:
                return
            if not self._at_head():
                self._upgrade()
            _MIGRATED.add(self.url)

    def _at_head(self) -> bool:
        """Whether the schema is at the head revision, asked without Alembic: one `alembic_version`
        query (an empty database has no such table: not at head)."""
        if head_revision() is None:
            return False
        try:
            with self.engine.connect() as connection:
                versions = [row[0] for row in connection.exec_driver_sql(REVISION_SQL)]
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as err:
            if _is_connect_failure(err):
                raise self._unavailable(err) from err
            return False  # no alembic_version table yet (SQLite)
        except sa.exc.ProgrammingError:
            return False  # no alembic_version table yet (PostgreSQL)
        return is_head(versions)

    def _upgrade(self) -> None:
        from alembic import command  # only to migrate: Alembic's import costs more than the rest of an open
        from alembic.config import Config

        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.set_main_option("sqlalchemy.url", self.url.replace("%", "%%"))
        try:
            with self._writer.begin() as connection:
                if not self.is_sqlite:
                    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as err:
            if _is_connect_failure(err):
                raise self._unavailable(err) from err
            raise EngineCacheError(f"cannot open the catalog at {self.safe_url}: {err.orig}") from err

    def _unavailable(self, err: sa.exc.DBAPIError) -> CatalogConnectError:
        reason = " ".join(str(err.orig).split())  # psycopg's message spans lines
        return CatalogConnectError(f"cannot reach the catalog at {self.safe_url}: {reason}", err)

    def _connect(self, session: Session) -> None:
        """Connect a new session now, so a catalog that cannot be reached raises CatalogConnectError
        here; errors of the statements the caller runs afterwards pass through as they are."""
        try:
            session.connection()
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as err:
            if _is_connect_failure(err):
                raise self._unavailable(err) from err
            raise

    @property
    def safe_url(self) -> str:
        return safe_url(self.url)

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        from sqlmodel import Session

        with Session(self._reader, expire_on_commit=False) as session:
            self._connect(session)
            yield session

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A session in one immediate transaction, committed on success, rolled back on error."""
        from sqlmodel import Session

        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            self._connect(session)
            yield session

    @contextlib.contextmanager
    def changes(self) -> Iterator[AlchemyExecutor]:
        """A `db.sqlexec` executor in one write transaction (as `write()`'s): what `db.engines`' changes
        run on outside a session of the caller's own."""
        with self.write() as session:
            yield AlchemyExecutor(session.connection())

    @contextlib.contextmanager
    def connect(self) -> Iterator[sa.Connection]:
        """A Core connection for reads (SQLAlchemy alone, no ORM): its first statement begins one
        transaction, so rows streamed from it come from one snapshot. An unreachable catalog raises
        CatalogConnectError here, as `read()` does."""
        try:
            connection = self.engine.connect()
        except (sa.exc.OperationalError, sa.exc.InterfaceError) as err:
            if _is_connect_failure(err):
                raise self._unavailable(err) from err
            raise
        with connection:
            yield connection

    def dispose(self) -> None:
        self.engine.dispose()


_KIND_TYPES: dict[str, Any] = {"json": sa.JSON(), "time": UTCDateTime(), "bool": sa.Boolean()}


class ConnectionRows(RowSource):
    """`db.reader.RowSource` on a SQLAlchemy connection (`Catalog.connect()`): any database, each column
    decoded by the SQLAlchemy type of its kind, rows fetched in batches (a server-side cursor on
    PostgreSQL)."""

    def __init__(self, connection: sa.Connection, *, batch: int = 1000) -> None:
        self._connection = connection
        self._batch = batch

    def _no_limit(self) -> int | None:
        return -1 if self._connection.dialect.name == "sqlite" else None  # PostgreSQL: LIMIT NULL

    def _select(self, sql: str, params: Mapping[str, Any], columns: Sequence[Column]) -> Iterator[tuple[Any, ...]]:
        typed = [sa.column(name, _KIND_TYPES[kind]) if kind else sa.column(name) for name, kind in columns]
        statement = sa.text(sql).columns(*typed)
        connection = self._connection
        if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
            # a server-side cursor on PostgreSQL, which lives in a transaction (a `read()` session's
            # connection, in autocommit, fetches its rows at once: its queries are small)
            connection = connection.execution_options(yield_per=self._batch)
        result = connection.execute(statement, dict(params))
        yield from result  # rows are tuples
