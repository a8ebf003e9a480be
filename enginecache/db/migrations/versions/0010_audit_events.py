"""audit_events: an append-only log of every change (who, when, what, from where)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03

`service.audit.record` writes one row right after each change succeeds (a model registered or
repaired, a build or test-load submitted, a job cancelled, an engine retired, something marked
CORRUPT); `enginecache audit` and the dashboard's Audit view read them, newest first.

Append-only at the database: triggers refuse UPDATE and DELETE of its rows, whoever issues them.
SQLite: BEFORE UPDATE and BEFORE DELETE triggers that RAISE(ABORT). PostgreSQL: one plpgsql function
that raises, called by a BEFORE UPDATE OR DELETE row trigger and a BEFORE TRUNCATE statement trigger
(TRUNCATE fires no row trigger). The triggers bind the application and anyone writing SQL through it;
whoever owns the database can still drop them. A later migration that makes SQLite's batch mode copy
this table drops its triggers with it and must create them again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

MESSAGE = "audit_events is append-only"
PG_FUNCTION = "audit_events_append_only"


def upgrade() -> None:
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("origin", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_audit_events_at", "audit_events", ["at"])
    op.create_index("ix_audit_events_action", "audit_events", ["action"])
    if op.get_bind().dialect.name == "sqlite":
        for event in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER audit_events_no_{event.lower()} BEFORE {event} ON audit_events "
                f"BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END"
            )
    else:
        op.execute(
            f"CREATE FUNCTION {PG_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN RAISE EXCEPTION '{MESSAGE}'; END; $$"
        )
        op.execute(
            f"CREATE TRIGGER audit_events_no_change BEFORE UPDATE OR DELETE ON audit_events "
            f"FOR EACH ROW EXECUTE FUNCTION {PG_FUNCTION}()"
        )
        op.execute(
            f"CREATE TRIGGER audit_events_no_truncate BEFORE TRUNCATE ON audit_events "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {PG_FUNCTION}()"
        )


def downgrade() -> None:
    op.drop_index("ix_audit_events_action", table_name="audit_events")
    op.drop_index("ix_audit_events_at", table_name="audit_events")
    op.drop_table("audit_events")  # its triggers go with it
    if op.get_bind().dialect.name != "sqlite":
        op.execute(f"DROP FUNCTION {PG_FUNCTION}()")
