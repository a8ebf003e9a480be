"""engines.remote_verified_at and engines.remote_problem: when the remote store's copy was re-hashed

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03

`enginecache verify --remote` re-hashes each engine's object in the remote store (ranged reads,
chunk digests where recorded) and records when (`remote_verified_at`) and what it found
(`remote_problem`: NULL where the object is the blob, else the one-line reason naming the key and
the chunk). The engine's status is its local blob's: a bad remote copy leaves it as it is, and the
next publish of the blob replaces the object. Rows from before stay NULL (never checked).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("remote_verified_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("remote_problem", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("remote_problem")
        batch.drop_column("remote_verified_at")
