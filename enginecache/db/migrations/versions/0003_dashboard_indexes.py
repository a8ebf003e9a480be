"""indexes for the dashboard's queries

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_jobs_status_created", "jobs", ["status", "created_at"]),
    ("ix_jobs_finished_at", "jobs", ["finished_at"]),
    ("ix_engines_status_created", "engines", ["status", "created_at"]),
    ("ix_engines_model_backend_precision", "engines", ["model_id", "backend", "precision", "targets"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
