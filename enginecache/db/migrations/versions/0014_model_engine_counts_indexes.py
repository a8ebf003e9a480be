"""indexes for the Models view's engine counts at 100,000 engines

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-01

`service.readmodels.models.model_rows` counts each model's engines twice over, grouped by the
source model (with the count of those built from no variant) and by the variant. Without these,
SQLite read every engine row for its variant column (0.28 s at 100,000 engines on the machine of
docs/performance.md) and sorted the variants for the second group; with them, each count is a
scan of its index alone (8 ms):

- ix_engines_model_variant: (model_id, variant_model_id), read in model order;
- ix_engines_variant: variant_model_id, a range of the non-null ones.

New indexes only: no batch mode is needed on SQLite.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

INDEXES = (
    ("ix_engines_model_variant", "engines", ["model_id", "variant_model_id"]),
    ("ix_engines_variant", "engines", ["variant_model_id"]),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
