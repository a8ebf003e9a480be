"""models and engines

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _tz() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(), nullable=False),
        sa.Column("digest", sa.String(length=64), nullable=False),
        sa.Column("filename", sa.String(), nullable=False),
        sa.Column("store_path", sa.String(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("info", sa.JSON(), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("recipe", sa.JSON(), nullable=False),
        sa.Column("recipe_key", sa.String(), nullable=True),
        sa.Column("created_at", _tz(), nullable=False),
        sa.ForeignKeyConstraint(["parent_id"], ["models.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("digest"),
    )
    op.create_index("ix_models_name", "models", ["name"])
    op.create_index("ix_models_parent_id", "models", ["parent_id"])
    op.create_index("ix_models_recipe_key", "models", ["recipe_key"])
    op.create_table(
        "engines",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("variant_model_id", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(), nullable=False),
        sa.Column("backend_version", sa.String(), nullable=False),
        sa.Column("precision", sa.String(), nullable=False),
        sa.Column("targets", sa.String(), nullable=False),
        sa.Column("cache_key", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(), nullable=False),
        sa.Column("onnx_digest", sa.String(), nullable=False),
        sa.Column("key_ingredients", sa.JSON(), nullable=False),
        sa.Column("precision_recipe", sa.JSON(), nullable=False),
        sa.Column("build_options", sa.JSON(), nullable=False),
        sa.Column("target_info", sa.JSON(), nullable=False),
        sa.Column("os", sa.String(), nullable=False),
        sa.Column("host", sa.JSON(), nullable=False),
        sa.Column("io", sa.JSON(), nullable=False),
        sa.Column("warnings", sa.JSON(), nullable=False),
        sa.Column("sha256", sa.String(), nullable=True),
        sa.Column("blake3", sa.String(), nullable=True),
        sa.Column("size_bytes", sa.BigInteger(), nullable=True),
        sa.Column("blob_path", sa.String(), nullable=True),
        sa.Column("build_seconds", sa.Float(), nullable=True),
        sa.Column("builder_log", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", _tz(), nullable=False),
        sa.Column("finished_at", _tz(), nullable=True),
        sa.Column("verified_at", _tz(), nullable=True),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.ForeignKeyConstraint(["variant_model_id"], ["models.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    for name, columns in (
        ("ix_engines_backend", ["backend"]),
        ("ix_engines_created_at", ["created_at"]),
        ("ix_engines_key_status", ["cache_key", "status"]),
        ("ix_engines_model_created", ["model_id", "created_at"]),
        ("ix_engines_precision", ["precision"]),
        ("ix_engines_sha256", ["sha256"]),
        ("ix_engines_status", ["status"]),
        ("ix_engines_targets", ["targets"]),
    ):
        op.create_index(name, "engines", columns)


def downgrade() -> None:
    op.drop_table("engines")
    op.drop_table("models")
