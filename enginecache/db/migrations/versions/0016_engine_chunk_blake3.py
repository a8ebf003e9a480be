"""engines.chunk_blake3: the BLAKE3 of each fixed-size chunk of an engine blob (core.chunkdigests)

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03

A load of a blob larger than one chunk verifies its chunks on every core as they land, a pull
fetches and verifies them independently (and resumes at whole chunks), and a mismatch names the
chunk. The store records the list in the pass that hashes the whole blob. Rows built before this
migration keep NULL: their loads check the whole-file digest, until `enginecache verify` records
the list.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("chunk_blake3", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("chunk_blake3")
