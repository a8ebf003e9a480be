"""Overview's read models: counts by status, cache hits and misses per day, the newest failures."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
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
)
from enginecache.service.context import AppContext
from enginecache.service.readmodels.days import DayBounds, counts_per_day, day_bounds
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
    """One day of cache activity: builds run (misses) and build requests answered by an existing
    engine (hits); serving processes' `load_or_build` lookups that found an engine and that did not."""

    day: str
    misses: int
    hits: int
    serving_hits: int = 0
    serving_misses: int = 0


def cache_activity(app: AppContext, *, days: int = 30) -> list[CacheDay]:
    """Per day: engines built (a miss each; failed and unpublished attempts are not counted); hits
    are build requests answered from the cache at submission (load events of source
    "build_request") plus build jobs that ended with an engine another job had built (a hit found
    at claim time); and serving processes' `load_or_build` lookups (load events of that source),
    hits and the rest. Counted in SQL per day (`counts_per_day`) on the indexes of migration 0008."""
    bounds = day_bounds(days)
    event = LoadEventRecord
    built = (EngineStatus.READY, EngineStatus.CORRUPT, EngineStatus.RETIRED)
    hit = col(event.outcome) == "hit"
    with app.catalog.read() as session:
        misses = counts_per_day(
            session, col(EngineRecord.created_at), [col(EngineRecord.status).in_(built)], bounds, {"n": None}
        )["n"]
        requests = counts_per_day(
            session, col(event.created_at), [col(event.source) == "build_request"], bounds, {"hits": hit}
        )["hits"]
        # A lookup that found no engine is any outcome but "hit": count those outcomes (a few percent
        # of the rows), not every lookup and then the hits.
        others = [o for o in _outcomes(session, "load_or_build") if o != "hit"]
        parts = {"hits": hit, **({"others": col(event.outcome).in_(others)} if others else {})}
        serving = counts_per_day(session, col(event.created_at), [col(event.source) == "load_or_build"], bounds, parts)
        job_hits = _job_hits_per_day(session, bounds)
    out = []
    for day, _, _ in bounds:
        row = CacheDay(
            day=day.isoformat(),
            misses=misses.get(day, 0),
            hits=requests.get(day, 0) + job_hits.get(day, 0),
            serving_hits=serving["hits"].get(day, 0),
            serving_misses=serving.get("others", {}).get(day, 0),
        )
        if row.misses or row.hits or row.serving_hits or row.serving_misses:
            out.append(row)
    return out


def _outcomes(session: Any, source: str) -> list[str]:
    """The distinct outcomes of load events of `source`, one index probe each (ix_load_events_source_
    outcome_created: the next outcome after the last), not a scan of the events."""
    event = LoadEventRecord
    found: list[str] = []
    while True:
        after = [col(event.outcome) > found[-1]] if found else []
        value = session.execute(
            sa.select(sa.func.min(col(event.outcome))).where(col(event.source) == source, *after)
        ).scalar_one()
        if value is None:
            return found
        found.append(str(value))


def _job_hits_per_day(session: Any, bounds: DayBounds) -> dict[date, int]:
    """Build jobs that SUCCEEDED with an engine another job built, per day they finished. The engine
    is matched on `engines.job_id` (its index holds the id too), not read by id: an engine row is
    large (its host fingerprint and builder log), and reading one per job dominated this count."""
    job = JobRecord
    own = sa.exists().where(
        col(EngineRecord.job_id) == col(job.id),
        (col(EngineRecord.id) + 0) == col(job.result_engine_id),  # `+ 0`: probe ix_engines_job_id, not the rowid
    )
    where = [
        col(job.kind) == "build",
        col(job.status) == JobStatus.SUCCEEDED,
        col(job.result_engine_id).is_not(None),
        ~own,
    ]
    return counts_per_day(session, col(job.finished_at), where, bounds, {"n": None})["n"]


@dataclass(frozen=True)
class Failure:
    source: str  # "job" | "engine"
    id: int
    when: datetime | None
    status: str
    what: str
    reason: str


def recent_failures(app: AppContext, *, limit: int = 20) -> list[Failure]:
    """The newest failed or dead jobs and failed or corrupt engines, each failure once with its
    reason: a build that failed leaves a FAILED job and a FAILED engine row, listed as the engine
    (it names the model; `job_id` the job). Models are named, not numbered."""
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
                col(EngineRecord.job_id),
                col(ModelRecord.name),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(col(EngineRecord.status).in_((EngineStatus.FAILED, EngineStatus.CORRUPT)))
            .order_by(col(EngineRecord.created_at).desc())
            .limit(limit)
        ).all()
        model_ids = [int(str(j.payload["model"])) for j in jobs if str((j.payload or {}).get("model", "")).isdigit()]
        names = dict(
            session.execute(
                sa.select(col(ModelRecord.id), col(ModelRecord.name)).where(col(ModelRecord.id).in_(model_ids))
            ).all()
        )
    listed_jobs = {int(e.job_id) for e in engines if e.job_id is not None and e.status == EngineStatus.FAILED}
    failures = [
        Failure(
            "job",
            int(j.id),
            j.finished_at,
            str(j.status),
            f"{j.kind} {_describe_payload(j.payload, names)}".strip(),
            j.error or "no reason recorded",
        )
        for j in jobs
        if int(j.id) not in listed_jobs
    ]
    failures += [
        Failure(
            "engine",
            int(e.id),
            e.finished_at or e.created_at,
            str(e.status),
            f"{e.name} {e.backend} {e.precision} {e.targets}" + (f" (job {e.job_id})" if e.job_id else ""),
            e.error or ("blob does not match its sha256" if e.status == EngineStatus.CORRUPT else "no reason recorded"),
        )
        for e in engines
    ]
    epoch = datetime.min.replace(tzinfo=UTC)
    failures.sort(key=lambda f: f.when or epoch, reverse=True)
    return failures[:limit]


def _describe_payload(payload: Mapping[str, Any] | None, names: Mapping[int, str]) -> str:
    if not payload:
        return ""
    model = str(payload.get("model") or "")
    parts = [names.get(int(model), f"model {model} (no longer in the catalog)") if model.isdigit() else model]
    parts = [p for p in parts if p]
    parts += [str(payload[k]) for k in ("backend", "precision") if payload.get(k)]
    if payload.get("targets"):
        parts.append(",".join(str(t) for t in payload["targets"]))
    if payload.get("engine_id"):
        parts.append(f"engine {payload['engine_id']}")
    return " ".join(parts)
