"""jobs.submitted_by: who submitted the job

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03

The name of the actor in effect when the job was enqueued (`service.access.audit.current_actor`: a
dashboard login, the CLI's OS user), so the worker that runs it records its changes (a converted
variant registered, an engine proven or found corrupt) as that person rather than as its own OS user.
Jobs from before stay NULL (the worker then names its own OS user).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("submitted_by", sa.String(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("submitted_by")
