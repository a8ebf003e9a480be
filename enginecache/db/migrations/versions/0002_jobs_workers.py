"""jobs, workers, engines.job_id

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

ACTIVE = "status IN ('QUEUED', 'RUNNING')"


def _tz() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("job_attempt", sa.Integer(), nullable=True))
        batch.create_index("ix_engines_job_id", ["job_id"])
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("idempotency_key", sa.String(), nullable=True),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("requirements", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_seconds", sa.Float(), nullable=False),
        sa.Column("lease_owner", sa.String(), nullable=True),
        sa.Column("runner_pid", sa.Integer(), nullable=True),
        sa.Column("lease_token", sa.String(), nullable=True),
        sa.Column("lease_expires_at", _tz(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("progress", sa.Float(), nullable=False),
        sa.Column("phase", sa.String(), nullable=True),
        sa.Column("log_tail", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("result_engine_id", sa.Integer(), nullable=True),
        sa.Column("run_after", _tz(), nullable=False),
        sa.Column("created_at", _tz(), nullable=False),
        sa.Column("started_at", _tz(), nullable=True),
        sa.Column("finished_at", _tz(), nullable=True),
        sa.Column("updated_at", _tz(), nullable=False),
        sa.ForeignKeyConstraint(["result_engine_id"], ["engines.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_jobs_kind", "jobs", ["kind"])
    op.create_index("ix_jobs_created_at", "jobs", ["created_at"])
    op.create_index("ix_jobs_status_run_after", "jobs", ["status", "run_after"])
    op.create_index(
        "ux_jobs_active_key",
        "jobs",
        ["idempotency_key"],
        unique=True,
        sqlite_where=sa.text(ACTIVE),
        postgresql_where=sa.text(ACTIVE),
    )
    op.create_table(
        "workers",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("fingerprint", sa.JSON(), nullable=False),
        sa.Column("capabilities", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("current_job_id", sa.Integer(), nullable=True),
        sa.Column("started_at", _tz(), nullable=False),
        sa.Column("heartbeat_at", _tz(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name"),
    )
    op.create_index("ix_workers_heartbeat_at", "workers", ["heartbeat_at"])


def downgrade() -> None:
    op.drop_table("workers")
    op.drop_table("jobs")
    with op.batch_alter_table("engines") as batch:
        batch.drop_index("ix_engines_job_id")
        batch.drop_column("job_attempt")
        batch.drop_column("job_id")
