"""Overview's read models: counts by status, cache hits and misses per day, the newest failures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from enginecache.db.models import (
    EngineRecord,
    EngineStatus,
    JobRecord,
    JobStatus,
    LoadEventRecord,
    ModelRecord,
    WorkerRecord,
    utcnow,
)
from enginecache.service.context import AppContext
from enginecache.service.readmodels.liveness import ONLINE, alive_since

FAILED_JOB_STATUSES = (JobStatus.FAILED, JobStatus.DEAD)


@dataclass(frozen=True)
class CatalogCounts:
    models: int
    source_models: int
    engines_by_status: dict[str, int]
    jobs_by_status: dict[str, int]
    workers_online: int
    workers_total: int

    @property
    def engines(self) -> int:
        return sum(self.engines_by_status.values())

    @property
    def jobs(self) -> int:
        return sum(self.jobs_by_status.values())


def catalog_counts(app: AppContext) -> CatalogCounts:
    """Models, engines by status, jobs by status, workers online: five small aggregate queries."""
    since = alive_since()
    with app.catalog.read() as session:
        models = session.execute(sa.select(sa.func.count()).select_from(ModelRecord)).scalar_one()
        sources = session.execute(
            sa.select(sa.func.count()).select_from(ModelRecord).where(col(ModelRecord.parent_id).is_(None))
        ).scalar_one()
        engines = session.execute(
            sa.select(col(EngineRecord.status), sa.func.count()).group_by(col(EngineRecord.status))
        ).all()
        jobs = session.execute(sa.select(col(JobRecord.status), sa.func.count()).group_by(col(JobRecord.status))).all()
        online = session.execute(
            sa.select(sa.func.count())
            .select_from(WorkerRecord)
            .where(col(WorkerRecord.heartbeat_at) >= since, col(WorkerRecord.status) == ONLINE)
        ).scalar_one()
        workers = session.execute(sa.select(sa.func.count()).select_from(WorkerRecord)).scalar_one()
    return CatalogCounts(
        models=int(models),
        source_models=int(sources),
        engines_by_status={str(s): int(n) for s, n in engines},
        jobs_by_status={str(s): int(n) for s, n in jobs},
        workers_online=int(online),
        workers_total=int(workers),
    )


@dataclass(frozen=True)
class CacheDay:
    """One day of cache activity: builds run (misses) and jobs served by an existing engine (hits)."""

    day: str
    misses: int
    hits: int


def _day(column: Any) -> Any:
    return sa.func.date(column)


def _day_text(value: Any) -> str:
    return value.isoformat() if isinstance(value, date) else str(value)


def cache_activity(app: AppContext, *, days: int = 30) -> list[CacheDay]:
    """Per day: engines built (a miss each; failed and unpublished attempts are not counted); hits
    are build requests answered from the cache at submission (load events of source
    "build_request") plus build jobs that ended with an engine another job had built (a hit found
    at claim time)."""
    since = utcnow() - timedelta(days=days)
    with app.catalog.read() as session:
        miss_day = _day(col(EngineRecord.created_at))
        misses = session.execute(
            sa.select(miss_day, sa.func.count())
            .where(
                col(EngineRecord.created_at) >= since,
                col(EngineRecord.status).in_((EngineStatus.READY, EngineStatus.CORRUPT, EngineStatus.RETIRED)),
            )
            .group_by(miss_day)
        ).all()
        hit_day = _day(col(JobRecord.finished_at))
        hits = session.execute(
            sa.select(hit_day, sa.func.count())
            .select_from(JobRecord)
            .join(EngineRecord, col(EngineRecord.id) == col(JobRecord.result_engine_id))
            .where(
                col(JobRecord.finished_at) >= since,
                col(JobRecord.kind) == "build",
                col(JobRecord.status) == JobStatus.SUCCEEDED,
                sa.or_(col(EngineRecord.job_id).is_(None), col(EngineRecord.job_id) != col(JobRecord.id)),
            )
            .group_by(hit_day)
        ).all()
        request_day = _day(col(LoadEventRecord.created_at))
        request_hits = session.execute(
            sa.select(request_day, sa.func.count())
            .where(
                col(LoadEventRecord.created_at) >= since,
                col(LoadEventRecord.source) == "build_request",
                col(LoadEventRecord.outcome) == "hit",
            )
            .group_by(request_day)
        ).all()
    by_day: dict[str, list[int]] = {}
    for day, n in request_hits:
        by_day.setdefault(_day_text(day), [0, 0])[1] += int(n)
    for day, n in misses:
        by_day.setdefault(_day_text(day), [0, 0])[0] = int(n)
    for day, n in hits:
        by_day.setdefault(_day_text(day), [0, 0])[1] += int(n)
    return [CacheDay(day, m, h) for day, (m, h) in sorted(by_day.items())]


@dataclass(frozen=True)
class Failure:
    source: str  # "job" | "engine"
    id: int
    when: datetime | None
    status: str
    what: str
    reason: str


def recent_failures(app: AppContext, *, limit: int = 20) -> list[Failure]:
    """The newest failed or dead jobs and failed or corrupt engines, with their reasons."""
    with app.catalog.read() as session:
        jobs = session.execute(
            sa.select(
                col(JobRecord.id),
                col(JobRecord.kind),
                col(JobRecord.status),
                col(JobRecord.error),
                col(JobRecord.finished_at),
                col(JobRecord.payload),
            )
            .where(col(JobRecord.status).in_(FAILED_JOB_STATUSES))
            .order_by(col(JobRecord.finished_at).desc())
            .limit(limit)
        ).all()
        engines = session.execute(
            sa.select(
                col(EngineRecord.id),
                col(EngineRecord.status),
                col(EngineRecord.error),
                col(EngineRecord.finished_at),
                col(EngineRecord.created_at),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(ModelRecord.name),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(col(EngineRecord.status).in_((EngineStatus.FAILED, EngineStatus.CORRUPT)))
            .order_by(col(EngineRecord.created_at).desc())
            .limit(limit)
        ).all()
    failures = [
        Failure(
            "job",
            int(j.id),
            j.finished_at,
            str(j.status),
            f"{j.kind} {_describe_payload(j.payload)}".strip(),
            j.error or "no reason recorded",
        )
        for j in jobs
    ]
    failures += [
        Failure(
            "engine",
            int(e.id),
            e.finished_at or e.created_at,
            str(e.status),
            f"{e.name} {e.backend} {e.precision} {e.targets}",
            e.error or ("blob does not match its sha256" if e.status == EngineStatus.CORRUPT else "no reason recorded"),
        )
        for e in engines
    ]
    epoch = datetime.min.replace(tzinfo=UTC)
    failures.sort(key=lambda f: f.when or epoch, reverse=True)
    return failures[:limit]


def _describe_payload(payload: Mapping[str, Any] | None) -> str:
    if not payload:
        return ""
    parts = [f"model {payload.get('model')}"] if payload.get("model") else []
    parts += [str(payload[k]) for k in ("backend", "precision") if payload.get(k)]
    if payload.get("targets"):
        parts.append(",".join(str(t) for t in payload["targets"]))
    if payload.get("engine_id"):
        parts.append(f"engine {payload['engine_id']}")
    return " ".join(parts)
