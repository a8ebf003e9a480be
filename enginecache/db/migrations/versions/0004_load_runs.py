"""load runs, ONNX stat cache, load events

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def _tz() -> sa.DateTime:
    return sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "load_runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("engine_id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(), nullable=False),
        sa.Column("precision", sa.String(), nullable=False),
        sa.Column("targets", sa.String(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("host_target", sa.String(), nullable=False),
        sa.Column("verdict", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        *[
            sa.Column(name, sa.Float(), nullable=True)
            for name in (
                "read_verify_s",
                "validity_s",
                "deserialize_s",
                "create_context_s",
                "allocate_io_s",
                "first_inference_s",
                "load_s",
            )
        ],
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("batch", sa.Integer(), nullable=True),
        *[
            sa.Column(name, sa.Float(), nullable=True)
            for name in ("p50_ms", "p90_ms", "p99_ms", "mean_ms", "throughput")
        ],
        sa.Column("samples_ms", sa.JSON(), nullable=False),
        sa.Column("accuracy", sa.JSON(), nullable=False),
        sa.Column("tolerances", sa.JSON(), nullable=False),
        sa.Column("input_shapes", sa.JSON(), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.Column("created_at", _tz(), nullable=False),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.id"]),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_load_runs_hostname", "load_runs", ["hostname"])
    op.create_index("ix_load_runs_verdict", "load_runs", ["verdict"])
    op.create_index("ix_load_runs_created_at", "load_runs", ["created_at"])
    op.create_index("ix_load_runs_engine_created", "load_runs", ["engine_id", "created_at"])
    op.create_index(
        "ix_load_runs_model_backend_precision", "load_runs", ["model_id", "backend", "precision", "targets"]
    )
    op.create_table(
        "onnx_stat_cache",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("path", sa.String(), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("mtime_ns", sa.BigInteger(), nullable=False),
        sa.Column("inode", sa.BigInteger(), nullable=False),
        sa.Column("files", sa.JSON(), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("racy", sa.Boolean(), nullable=False),
        sa.Column("hashed_at", _tz(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("hostname", "path", name="ux_onnx_stat_cache_host_path"),
    )
    op.create_table(
        "load_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("hostname", sa.String(), nullable=False),
        sa.Column("model_name", sa.String(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=True),
        sa.Column("engine_id", sa.Integer(), nullable=True),
        sa.Column("backend", sa.String(), nullable=False),
        sa.Column("precision", sa.String(), nullable=False),
        sa.Column("host_target", sa.String(), nullable=False),
        sa.Column("outcome", sa.String(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        *[sa.Column(name, sa.Float(), nullable=True) for name in ("lookup_s", "read_verify_s", "load_s", "build_s")],
        sa.Column("total_s", sa.Float(), nullable=False),
        sa.Column("stat_cache_hit", sa.Boolean(), nullable=True),
        sa.Column("phases", sa.JSON(), nullable=False),
        sa.Column("created_at", _tz(), nullable=False),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"]),
        sa.ForeignKeyConstraint(["engine_id"], ["engines.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_load_events_created_at", "load_events", ["created_at"])
    op.create_index("ix_load_events_model_host_created", "load_events", ["model_name", "hostname", "created_at"])
    op.create_index("ix_load_events_outcome_created", "load_events", ["outcome", "created_at"])


def downgrade() -> None:
    op.drop_table("load_events")
    op.drop_table("onnx_stat_cache")
    op.drop_table("load_runs")
