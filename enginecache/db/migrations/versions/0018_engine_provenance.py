"""engines.provenance: where an engine came from (built here, or `engine import`ed) and UNPROVEN

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03

An engine built elsewhere (CI's `trtexec`, a team's own build script) is registered with
`enginecache engine import`: its row records who imported it, from where, what was declared and what
its header proved, and its status is UNPROVEN (a new value of the `status` string column, so no
constraint changes) until a host that can load it does. Rows from before this migration were built
here: `{}`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.add_column(sa.Column("provenance", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    with op.batch_alter_table("engines") as batch:
        batch.drop_column("provenance")
