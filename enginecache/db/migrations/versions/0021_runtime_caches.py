"""runtime_caches: TensorRT-RTX runtime caches published by serving hosts

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

A serving process that loaded a TensorRT-RTX engine compiled its kernels for the GPU it runs on and
can publish them (`enginecache runtime-cache publish`): the bytes go to the store as a blob, and
this row keys them by (engine, GPU SKU, compute capability, TensorRT-RTX version, CUDA version), so
`pull` and `load_or_build` on another host can fetch the best one `core.runtimecache` allows.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_caches",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("engine_id", sa.Integer(), sa.ForeignKey("engines.id"), nullable=False),
        sa.Column("engine_sha256", sa.String(), nullable=False),
        sa.Column("gpu_sku", sa.String(), nullable=False),
        sa.Column("compute_capability", sa.String(), nullable=False),
        sa.Column("rtx_version", sa.String(), nullable=False),
        sa.Column("cuda_version", sa.String(), nullable=False),
        sa.Column("sha256", sa.String(), nullable=False),
        sa.Column("blake3", sa.String(), nullable=False),
        sa.Column("chunk_blake3", sa.Text(), nullable=False, server_default=""),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(), nullable=False),
        sa.Column("host", sa.String(), nullable=False),
        sa.UniqueConstraint(
            "engine_id",
            "gpu_sku",
            "compute_capability",
            "rtx_version",
            "cuda_version",
            "sha256",
            name="uq_runtime_caches_key_blob",
        ),
    )
    op.create_index("ix_runtime_caches_engine_sm", "runtime_caches", ["engine_id", "compute_capability", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_runtime_caches_engine_sm", table_name="runtime_caches")
    op.drop_table("runtime_caches")
