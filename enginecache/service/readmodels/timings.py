"""Timings' read models: build time and engine size per model x backend x targets x precision.

Load-phase timings and `load_or_build` hit rates come from the test-load harness's aggregates
(`service.loadruns`)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlmodel import col

from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord
from enginecache.service.context import AppContext


@dataclass(frozen=True)
class BuildTimeGroup:
    model: str
    backend: str
    targets: str
    precision: str
    engines: int
    mean_seconds: float
    min_seconds: float
    max_seconds: float
    mean_size_bytes: float


def build_time_groups(app: AppContext, *, limit: int = 500) -> list[BuildTimeGroup]:
    """Build time (and engine size) per model x backend x targets x precision, over READY engines
    (and retired ones, which were built all the same)."""
    seconds = col(EngineRecord.build_seconds)
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(
                col(ModelRecord.name),
                col(EngineRecord.backend),
                col(EngineRecord.targets),
                col(EngineRecord.precision),
                sa.func.count(),
                sa.func.avg(seconds),
                sa.func.min(seconds),
                sa.func.max(seconds),
                sa.func.avg(col(EngineRecord.size_bytes)),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(seconds.is_not(None), col(EngineRecord.status).in_((EngineStatus.READY, EngineStatus.RETIRED)))
            .group_by(
                col(ModelRecord.name), col(EngineRecord.backend), col(EngineRecord.targets), col(EngineRecord.precision)
            )
            .order_by(col(ModelRecord.name), col(EngineRecord.precision), col(EngineRecord.targets))
            .limit(limit)
        ).all()
    return [
        BuildTimeGroup(
            model=str(r[0]),
            backend=str(r[1]),
            targets=str(r[2]),
            precision=str(r[3]),
            engines=int(r[4]),
            mean_seconds=float(r[5] or 0.0),
            min_seconds=float(r[6] or 0.0),
            max_seconds=float(r[7] or 0.0),
            mean_size_bytes=float(r[8] or 0.0),
        )
        for r in rows
    ]
