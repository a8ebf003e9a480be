"""user_roles: who may do what on a dashboard with a login (viewer < operator < admin)

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

One row per logged-in user (`subject`: the login's e-mail, lowercased) naming their role;
`service.access` reads it on every call that changes something and on every dashboard rerun. A user
without a row is denied (deny by default); the CLI, workers, serving processes and a dashboard
without a login act as the local admin and need none. `enginecache role set|remove|list` manages it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "user_roles",
        sa.Column("subject", sa.String(), nullable=False),
        sa.Column("role", sa.String(), nullable=False),
        sa.Column("granted_by", sa.String(), nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("role IN ('viewer', 'operator', 'admin')", name="ck_user_roles_role"),
        sa.PrimaryKeyConstraint("subject"),
    )


def downgrade() -> None:
    op.drop_table("user_roles")
