"""load_events.source: serving lookups (load_or_build) and build requests

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("load_events") as batch:
        batch.add_column(sa.Column("source", sa.String(), nullable=False, server_default="load_or_build"))
        batch.create_index("ix_load_events_source", ["source"])


def downgrade() -> None:
    with op.batch_alter_table("load_events") as batch:
        batch.drop_index("ix_load_events_source")
        batch.drop_column("source")
