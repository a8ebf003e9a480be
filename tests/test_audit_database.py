"""The audit log at the database: rows it refuses to change or delete (SQLite and PostgreSQL), and
the migration that adds its table and triggers, up and down."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from enginecache.db.catalog import MIGRATIONS_DIR
from enginecache.db.models import AuditEventRecord
from enginecache.db.reader import sqlite_url
from enginecache.service.access import audit
from enginecache.service.access.audit import acting_as, list_audit, record
from enginecache.service.context import AppContext
from tests.auditkit import ALICE

# -- append-only at the database --------------------------------------------------------------


def test_the_database_refuses_to_update_or_delete_audit_rows(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    with acting_as(ALICE):
        event = record(app, audit.ENGINE_RETIRE, "engine 1", {"was": "READY"})
    statements = [
        f"UPDATE audit_events SET actor = 'mallory' WHERE id = {event.id}",
        "UPDATE audit_events SET details = '{}'",
        f"DELETE FROM audit_events WHERE id = {event.id}",
        "DELETE FROM audit_events",
    ]
    if not app.catalog.is_sqlite:
        statements.append("TRUNCATE audit_events")
    for statement in statements:
        refused = pytest.raises(sa.exc.DBAPIError, match="audit_events is append-only")
        with refused, app.catalog.engine.begin() as connection:
            connection.exec_driver_sql(statement)
    refused = pytest.raises(sa.exc.DBAPIError, match="audit_events is append-only")
    with refused, app.catalog.write() as session:  # through the ORM too
        row = session.get(AuditEventRecord, event.id)
        assert row is not None
        row.actor = "mallory"
        session.add(row)
    [kept] = list_audit(app)
    assert (kept.id, kept.actor, kept.origin, kept.details) == (event.id, ALICE.name, ALICE.origin, {"was": "READY"})
    record(app, "test.more", "appending still works")
    assert len(list_audit(app)) == 2


# -- the migration ----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "catalog.db")
    url: str = request.getfixturevalue("pg_url")
    return url


def _alembic(url: str, step: Callable[[Config, str], None], revision: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))
            config.attributes["connection"] = connection
            step(config, revision)
    finally:
        engine.dispose()


def _audit_objects(url: str) -> tuple[set[str], set[str], set[str]]:
    """The audit table, its indexes and its triggers as the database lists them (and, on PostgreSQL,
    the trigger function among the triggers)."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            tables = {t for t in inspector.get_table_names() if t == "audit_events"}
            indexes = {i["name"] or "" for i in inspector.get_indexes("audit_events")} if tables else set()
            if connection.dialect.name == "sqlite":
                sql = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
            else:
                sql = (
                    "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
                    "UNION SELECT proname FROM pg_proc WHERE proname = 'audit_events_append_only'"
                )
            triggers = {row[0] for row in connection.exec_driver_sql(sql)}
    finally:
        engine.dispose()
    return tables, indexes, triggers


def test_the_migration_adds_the_table_and_triggers_and_removes_them_again(empty_db_url: str) -> None:
    url = empty_db_url
    _alembic(url, command.upgrade, "0009")
    assert _audit_objects(url) == (set(), set(), set())
    _alembic(url, command.upgrade, "0010")
    tables, indexes, triggers = _audit_objects(url)
    assert tables == {"audit_events"} and indexes == {"ix_audit_events_at", "ix_audit_events_action"}
    if url.startswith("sqlite"):
        assert triggers == {"audit_events_no_update", "audit_events_no_delete"}
    else:
        assert triggers == {"audit_events_no_change", "audit_events_no_truncate", "audit_events_append_only"}
    _alembic(url, command.downgrade, "0009")
    assert _audit_objects(url) == (set(), set(), set()), "the downgrade leaves nothing behind"
    _alembic(url, command.upgrade, "head")  # and the upgrade runs again on what the downgrade left
    assert _audit_objects(url)[0] == {"audit_events"}
