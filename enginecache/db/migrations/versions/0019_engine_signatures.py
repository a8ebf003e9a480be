"""engines.signed_statement and engines.signature: an engine's signed provenance (core.signing)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03

A build pool with a signing key signs a statement binding the engine's digests to its cache key and
ingredients, its source model, backend, version, precision, targets and origin; the row keeps the
statement's exact text and its Ed25519 signature. Where trusted keys are configured, every load,
pull, verify and check refuses an engine whose statement does not vouch for its row and request.
Rows from before this migration stay NULL (unsigned) until an admin's `enginecache verify --sign`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("signed_statement", sa.Text(), nullable=True))
        batch.add_column(sa.Column("signature", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("signature")
        batch.drop_column("signed_statement")
