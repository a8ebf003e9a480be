"""Reads of test-load runs and serving load events, for the CLI and the dashboard: one run as a dict,
an engine's runs, mean seconds per load phase (cold build vs warm load), and cache hit rates."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.targettext import split_targets
from enginecache.core.verdicts import Verdict
from enginecache.db.models import EngineRecord, LoadEventRecord, LoadRunRecord, ModelRecord
from enginecache.service.context import AppContext


def load_run_to_dict(run: LoadRunRecord) -> dict[str, Any]:
    return {
        "id": run.id,
        "engine_id": run.engine_id,
        "model_id": run.model_id,
        "job_id": run.job_id,
        "backend": run.backend,
        "precision": run.precision,
        "targets": list(split_targets(run.targets)),
        "hostname": run.hostname,
        "host_target": run.host_target,
        "verdict": run.verdict,
        "reason": run.reason,
        "phases": {
            name: getattr(run, f"{name}_s")
            for name in ("read_verify", "validity", "deserialize", "create_context", "allocate_io", "first_inference")
            if getattr(run, f"{name}_s") is not None
        },
        "load_seconds": run.load_s,
        "latency": None
        if run.p50_ms is None
        else {
            "iterations": run.iterations,
            "batch": run.batch,
            "p50_ms": run.p50_ms,
            "p90_ms": run.p90_ms,
            "p99_ms": run.p99_ms,
            "mean_ms": run.mean_ms,
            "throughput": run.throughput,
        },
        "samples_ms": list(run.samples_ms),
        "accuracy": list(run.accuracy),
        "tolerances": dict(run.tolerances),
        "input_shapes": dict(run.input_shapes),
        "details": dict(run.details),
        "created_at": run.created_at.isoformat(),
    }


def list_load_runs(app: AppContext, engine_id: int, *, limit: int = 100) -> list[dict[str, Any]]:
    """An engine's test-load runs, newest first."""
    query = (
        select(LoadRunRecord)
        .where(LoadRunRecord.engine_id == engine_id)
        .order_by(col(LoadRunRecord.created_at).desc(), col(LoadRunRecord.id).desc())
        .limit(limit)
    )
    with app.catalog.read() as session:
        return [load_run_to_dict(r) for r in session.exec(query).all()]


def load_phase_stats(app: AppContext) -> list[dict[str, Any]]:
    """Mean seconds per load phase by model, backend, targets and precision (test-loads that loaded),
    beside the mean cold build time of the same engines: cold build vs warm load."""
    run = LoadRunRecord
    phase_cols = ("read_verify_s", "validity_s", "deserialize_s", "create_context_s", "allocate_io_s", "load_s")
    loaded = col(run.verdict).in_((Verdict.PASS.outcome, Verdict.FAIL.outcome))
    query = (
        sa.select(
            col(ModelRecord.name).label("model"),
            col(run.backend),
            col(run.targets),
            col(run.precision),
            sa.func.count(col(run.id)).label("runs"),
            *[sa.func.avg(getattr(run, c)).label(c) for c in phase_cols],
            sa.func.avg(col(run.first_inference_s)).label("first_inference_s"),
            sa.func.avg(col(run.p50_ms)).label("p50_ms"),
            sa.func.avg(col(EngineRecord.build_seconds)).label("build_s"),
        )
        .join(ModelRecord, col(ModelRecord.id) == col(run.model_id))
        .join(EngineRecord, col(EngineRecord.id) == col(run.engine_id))
        .where(loaded)
        .group_by(col(ModelRecord.name), col(run.backend), col(run.targets), col(run.precision))
        .order_by(col(ModelRecord.name), col(run.backend), col(run.precision))
    )
    with app.catalog.read() as session:
        rows = session.execute(query).mappings().all()
    return [{k: (float(v) if isinstance(v, float) else v) for k, v in row.items()} for row in rows]


def load_event_stats(app: AppContext) -> list[dict[str, Any]]:
    """`load_or_build` calls by model, host and day: counts per outcome and the cache hit rate."""
    event = LoadEventRecord
    day = sa.func.date(col(event.created_at)).label("day")
    hit = sa.case((col(event.outcome) == "hit", 1), else_=0)
    query = (
        sa.select(
            col(event.model_name).label("model"),
            col(event.hostname).label("host"),
            day,
            sa.func.count(col(event.id)).label("calls"),
            sa.func.sum(hit).label("hits"),
            sa.func.sum(sa.case((col(event.outcome) == "miss", 1), else_=0)).label("misses"),
            sa.func.sum(sa.case((col(event.outcome) == "built", 1), else_=0)).label("built"),
            sa.func.sum(sa.case((col(event.outcome) == "rejected", 1), else_=0)).label("rejected"),
            sa.func.avg(col(event.total_s)).label("mean_total_s"),
            sa.func.avg(sa.case((col(event.outcome) == "hit", col(event.total_s)), else_=None)).label("mean_hit_s"),
        )
        .where(col(event.source) == "load_or_build")
        .group_by(col(event.model_name), col(event.hostname), day)
        .order_by(day, col(event.model_name), col(event.hostname))
    )
    with app.catalog.read() as session:
        rows = session.execute(query).mappings().all()
    out = []
    for row in rows:
        data = dict(row)
        data["day"] = str(data["day"])
        data["hits"] = int(data["hits"] or 0)
        data["hit_rate"] = data["hits"] / data["calls"] if data["calls"] else 0.0
        out.append(data)
    return out
