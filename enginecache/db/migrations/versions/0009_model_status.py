"""models.status: OK, or CORRUPT once the stored bundle no longer hashes to the model's digest

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

`enginecache verify` re-hashes each stored model bundle (the files the digest covers) and a build
re-hashes the one it reads; a mismatch or a missing file marks the model CORRUPT, and re-adding the
original bytes rewrites the bundle and sets it back to OK. Every existing model starts OK (the server
default), as it was trusted before. One added column: SQLite's ALTER TABLE ADD COLUMN, no table copy.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.add_column(sa.Column("status", sa.String(), nullable=False, server_default="OK"))


def downgrade() -> None:
    with op.batch_alter_table("models") as batch:
        batch.drop_column("status")
