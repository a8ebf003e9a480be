"""alias_moves: releases, the history of every alias of a model name

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01

A model name's versions are its source models (registered bytes under that name, numbered 1, 2, ...
by id); an alias (`prod`, `canary`) points a name at one version, for every host or for one GPU class
(`prod@sm86`). Each move is a row, never updated: `promote` points the alias at a version, `rollback`
takes the last promote back (the alias then points where it pointed before). `service.releases`
replays the rows to answer where an alias points; `enginecache release` and the dashboard write them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alias_moves",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("alias", sa.String(), nullable=False),
        sa.Column("gpu_class", sa.String(), nullable=False),
        sa.Column("action", sa.String(), nullable=False),
        sa.Column("model_id", sa.Integer(), sa.ForeignKey("models.id"), nullable=True),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("action IN ('promote', 'rollback')", name="ck_alias_moves_action"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_alias_moves_name_alias", "alias_moves", ["name", "alias", "gpu_class", "id"])


def downgrade() -> None:
    op.drop_index("ix_alias_moves_name_alias", table_name="alias_moves")
    op.drop_table("alias_moves")
