"""indexes for the dashboard at 100,000 engines and 1,000,000 load events

Revision ID: 0008
Revises: 0006
Create Date: 2026-12-01

Each serves one read model (enginecache/service/readmodels) from the index alone:

- ix_engines_build_groups: Timings' build time per model x backend x targets x precision, read in
  group order (no sort, no engine row: a row holds its host fingerprint and builder log);
- ix_jobs_kind_status_finished, ix_engines_job_engine: Overview's build jobs answered by another
  job's engine, per day (the engine matched on its job id from the index, not by reading its row);
- ix_load_events_source_created, ix_load_events_source_outcome_created: Overview's `load_or_build`
  lookups, their hits and build-request hits per day (one COUNT over an index range per day);
- ix_load_events_model_host_source: Timings' busiest (model, host) pairs and their days (SQLite
  reads it in group order; each chosen pair is one range).

New indexes only: no batch mode is needed on SQLite.
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0006"
branch_labels = None
depends_on = None

INDEXES = (
    (
        "ix_engines_build_groups",
        "engines",
        ["model_id", "backend", "targets", "precision", "status", "build_seconds", "size_bytes"],
    ),
    ("ix_engines_job_engine", "engines", ["job_id", "id"]),
    ("ix_jobs_kind_status_finished", "jobs", ["kind", "status", "finished_at", "result_engine_id"]),
    ("ix_load_events_source_created", "load_events", ["source", "created_at"]),
    ("ix_load_events_source_outcome_created", "load_events", ["source", "outcome", "created_at"]),
    (
        "ix_load_events_model_host_source",
        "load_events",
        ["model_name", "hostname", "source", "created_at", "outcome", "total_s"],
    ),
)


def upgrade() -> None:
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    for name, table, _ in reversed(INDEXES):
        op.drop_index(name, table_name=table)
