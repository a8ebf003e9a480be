"""engines.retired_at: when an engine was RETIRED

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01

`enginecache gc` removes a RETIRED engine's blob once the grace period has passed since it was
retired; before this column the catalog recorded no such time and the grace counted from the
engine's latest recorded time (so an engine built a month ago and retired today was removable at
once). Rows retired before this migration keep NULL and the old rule.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("retired_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("retired_at")
