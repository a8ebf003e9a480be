"""Opening the catalog: engine settings per database, migrations, read and write sessions.

SQLite: WAL, synchronous=FULL, busy_timeout, foreign keys, and `BEGIN IMMEDIATE` for write
sessions (so two writers never deadlock upgrading a read lock). PostgreSQL through a URL.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event
from sqlmodel import Session

from enginecache.errors import CatalogUnavailableError, EngineCacheError

logger = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
MIGRATION_LOCK_KEY = 0x656E67696E65  # "engine": the advisory lock migrations hold on PostgreSQL
_MIGRATE_LOCK = threading.Lock()
_MIGRATED: set[str] = set()


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def normalize_url(url: str) -> str:
    """Use psycopg (v3) for plain `postgresql://` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


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
        else:
            self.engine = sa.create_engine(self.url, pool_pre_ping=True)
            self._writer = self.engine.execution_options()
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
            self._upgrade()
            _MIGRATED.add(self.url)

    def _upgrade(self) -> None:
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
        return sa.make_url(self.url).render_as_string(hide_password=True)

    @contextlib.contextmanager
    def read(self) -> Iterator[Session]:
        with Session(self.engine, expire_on_commit=False) as session:
            self._connect(session)
            yield session

    @contextlib.contextmanager
    def write(self) -> Iterator[Session]:
        """A session in one immediate transaction, committed on success, rolled back on error."""
        with Session(self._writer, expire_on_commit=False) as session, session.begin():
            self._connect(session)
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
