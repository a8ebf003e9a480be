"""Timings' read models: build time and engine size per model x backend x targets x precision;
`load_or_build` hit rates of the busiest model and host pairs; cold start (the recorded build)
against warm start (the recorded `load_or_build` cache hits of the same engines).

Load-phase timings come from the test-load harness's aggregates (`service.engines.loadruns`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from enginecache.db.models import EngineRecord, EngineStatus, LoadEventRecord, ModelRecord, utcnow
from enginecache.service.context import AppContext
from enginecache.service.readmodels.days import utc_day


@dataclass(frozen=True)
class EngineGroup:
    """One model x backend x targets x precision, and how many of its engines a figure counts."""

    model: str
    backend: str
    targets: str
    precision: str
    engines: int


def _group_fields(row: Any) -> dict[str, Any]:
    """An `EngineGroup`'s fields from the first five columns of a grouped row (the group, the count)."""
    return {
        "model": str(row[0]),
        "backend": str(row[1]),
        "targets": str(row[2]),
        "precision": str(row[3]),
        "engines": int(row[4]),
    }


@dataclass(frozen=True)
class BuildTimeGroup(EngineGroup):
    mean_seconds: float
    min_seconds: float
    max_seconds: float
    mean_size_bytes: float


def build_time_groups(app: AppContext, *, limit: int = 500) -> list[BuildTimeGroup]:
    """Build time (and engine size) per model x backend x targets x precision, over READY engines
    (and retired ones, which were built all the same).

    Aggregated per model id first, in the order of ix_engines_build_groups (model_id, backend,
    targets, precision, status, build_seconds, size_bytes: migration 0008), so the database reads
    only that index and groups without sorting; then per model name (two models may share one)."""
    engine = EngineRecord
    seconds = col(engine.build_seconds)
    keys = (col(engine.model_id), col(engine.backend), col(engine.targets), col(engine.precision))
    per_model = (
        sa.select(
            *keys,
            sa.func.count().label("n"),
            sa.func.sum(seconds).label("total_s"),
            sa.func.min(seconds).label("min_s"),
            sa.func.max(seconds).label("max_s"),
            sa.func.sum(col(engine.size_bytes)).label("total_size"),
            sa.func.count(col(engine.size_bytes)).label("sized"),
        )
        .where(seconds.is_not(None), col(engine.status).in_((EngineStatus.READY, EngineStatus.RETIRED)))
        .group_by(*keys)
        .subquery()
    )
    group = (col(ModelRecord.name), per_model.c.backend, per_model.c.targets, per_model.c.precision)
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(
                *group,
                sa.func.sum(per_model.c.n),
                sa.func.sum(per_model.c.total_s),
                sa.func.min(per_model.c.min_s),
                sa.func.max(per_model.c.max_s),
                sa.func.sum(per_model.c.total_size),
                sa.func.sum(per_model.c.sized),
            )
            .join(ModelRecord, col(ModelRecord.id) == per_model.c.model_id)
            .group_by(*group)
            .order_by(col(ModelRecord.name), per_model.c.precision, per_model.c.targets)
            .limit(limit)
        ).all()
    return [
        BuildTimeGroup(
            **_group_fields(r),
            mean_seconds=float(r[5] or 0.0) / int(r[4]),
            min_seconds=float(r[6] or 0.0),
            max_seconds=float(r[7] or 0.0),
            mean_size_bytes=float(r[8] or 0.0) / int(r[9]) if r[9] else 0.0,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class HitRates:
    """`load_or_build` calls and hits per day of the busiest (model, host) pairs in a window."""

    rows: list[dict[str, Any]]  # model, host, day, calls, hits, hit_rate, mean_total_s
    pairs_shown: int
    pairs_total: int
    days: int


def serving_hit_rates(app: AppContext, *, days: int = 30, pairs: int = 10) -> HitRates:
    """Serving processes' cache hit rate per day over the last `days` days, for the `pairs` (model,
    host) pairs with the most `load_or_build` calls in that window: a chart of every pair of a
    fleet (a thousand lines for 50 models on 20 hosts) is unreadable, and its rows are every day of
    every pair. Two statements on ix_load_events_model_host_source (model_name, hostname, source,
    created_at, outcome, total_s: migration 0008): the calls per pair (the index in group order, no
    sort), then the chosen pairs' days (one index range each: an OR of pairs, which SQLite probes
    one by one where a row-value IN would scan the index)."""
    event = LoadEventRecord
    since = utcnow() - timedelta(days=days)
    serving = [col(event.source) == "load_or_build", col(event.created_at) >= since]
    pair = (col(event.model_name), col(event.hostname))
    with app.catalog.read() as session:
        per_pair = session.execute(
            sa.select(*pair, sa.func.count().label("calls")).where(*serving).group_by(*pair)
        ).all()
        busiest = sorted(per_pair, key=lambda r: (-int(r[2]), str(r[0]), str(r[1])))[:pairs]
        chosen = [(str(m), str(h)) for m, h, _ in busiest]
        rows: list[dict[str, Any]] = []
        if chosen:
            day = utc_day(col(event.created_at), session.get_bind().dialect.name).label("day")
            hit = sa.case((col(event.outcome) == "hit", 1), else_=0)
            hit_s = sa.case((col(event.outcome) == "hit", col(event.total_s)), else_=None)
            found = session.execute(
                sa.select(
                    *pair,
                    day,
                    sa.func.count().label("calls"),
                    sa.func.sum(hit).label("hits"),
                    sa.func.avg(col(event.total_s)).label("mean_total_s"),
                    sa.func.avg(hit_s).label("mean_hit_s"),
                )
                .where(*serving, sa.or_(*[sa.and_(pair[0] == m, pair[1] == h) for m, h in chosen]))
                .group_by(*pair, day)
                .order_by(day, *pair)
            ).all()
            for model, host, when, calls, hits, mean_total, mean_hit in found:
                rows.append(
                    {
                        "model": str(model),
                        "host": str(host),
                        "day": str(when),
                        "calls": int(calls),
                        "hits": int(hits or 0),
                        "hit_rate": int(hits or 0) / int(calls) if calls else 0.0,
                        "mean_total_s": float(mean_total) if mean_total is not None else None,
                        "mean_hit_s": float(mean_hit) if mean_hit is not None else None,
                    }
                )
    return HitRates(rows=rows, pairs_shown=len(chosen), pairs_total=len(per_pair), days=days)


@dataclass(frozen=True)
class ColdWarm(EngineGroup):
    """One engine group: what building its engines took (cold start) and
    what the product's own cache hit took to hand the same engines to a serving process (warm
    start: a `load_or_build` call that found the engine, its lookup, read and verify and load).
    `engines` counts the engines with cache hits in the window."""

    build_s: float  # their mean recorded build time
    hits: int
    hit_s: float  # the mean total seconds of those hits


def cold_warm_starts(app: AppContext, *, days: int = 30, limit: int = 100) -> list[ColdWarm]:
    """Per engine group, over the `load_or_build` hits of the last `days` days: the mean build
    seconds of the engines hit (each engine once) against the mean seconds of the hits. The hits
    are one range of ix_load_events_source_outcome_created, summed per engine, then joined to the
    engines (their recorded `build_seconds`) and grouped; engines without a recorded build time
    (built elsewhere and imported) are left out."""
    event = LoadEventRecord
    since = utcnow() - timedelta(days=days)
    per_engine = (
        sa.select(
            col(event.engine_id).label("engine_id"),
            sa.func.count().label("hits"),
            sa.func.sum(col(event.total_s)).label("total_s"),
        )
        .where(
            col(event.source) == "load_or_build",
            col(event.outcome) == "hit",
            col(event.created_at) >= since,
            col(event.engine_id).is_not(None),
        )
        .group_by(col(event.engine_id))
        .subquery()
    )
    engine = EngineRecord
    group = (col(ModelRecord.name), col(engine.backend), col(engine.targets), col(engine.precision))
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(
                *group,
                sa.func.count(),
                sa.func.avg(col(engine.build_seconds)),
                sa.func.sum(per_engine.c.hits),
                sa.func.sum(per_engine.c.total_s),
            )
            .select_from(per_engine)
            .join(engine, col(engine.id) == per_engine.c.engine_id)
            .join(ModelRecord, col(ModelRecord.id) == col(engine.model_id))
            .where(col(engine.build_seconds).is_not(None))
            .group_by(*group)
            .order_by(*group)
            .limit(limit)
        ).all()
    return [
        ColdWarm(
            **_group_fields(r),
            build_s=float(r[5] or 0.0),
            hits=int(r[6] or 0),
            hit_s=float(r[7] or 0.0) / int(r[6]) if r[6] else 0.0,
        )
        for r in rows
    ]
