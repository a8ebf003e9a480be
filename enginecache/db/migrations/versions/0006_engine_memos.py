"""engine_memos: the serving lookup's remembered answers (the stdlib cache-hit path)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A new table and its indexes only: no ALTER of an existing table, so no batch mode is needed on SQLite.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "engine_memos",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("memo_key", sa.String(64), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("engine_id", sa.Integer(), nullable=False),
        sa.Column("cache_key", sa.String(64), nullable=False),
        sa.Column("ready_engines", sa.Text(), nullable=False),
        sa.Column("host_target", sa.String(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("request", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("memo_key", name="ux_engine_memos_key"),
    )
    op.create_index("ix_engine_memos_model_id", "engine_memos", ["model_id"])
    op.create_index("ix_engine_memos_engine_id", "engine_memos", ["engine_id"])


def downgrade() -> None:
    op.drop_index("ix_engine_memos_engine_id", table_name="engine_memos")
    op.drop_index("ix_engine_memos_model_id", table_name="engine_memos")
    op.drop_table("engine_memos")
