"""engines.header_blake3: the BLAKE3 of an engine blob's first 4096 bytes (its header)

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02

A load checks the header first, on bytes verified against this digest, so a host that cannot run
the engine (TensorRT-RTX's `get_engine_validity` says INVALID) refuses it without reading and hashing
the rest of a blob that may be gigabytes (service.engineload). The store records it in the pass that
hashes the whole blob. Rows built before this migration keep NULL: their loads read the whole blob
first, as before, until `enginecache verify` (which hashes the whole blob) records the header's.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("header_blake3", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("header_blake3")
