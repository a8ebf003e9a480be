"""Jobs' read models (Build's matrix and job list): queued and running jobs, jobs by id, the
active job and the last failed build of each cache key, and the recent jobs with the names they
concern and what a job no live worker can run needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.backends.registry import backend_label
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus, ModelRecord, WorkerRecord
from enginecache.service.context import AppContext
from enginecache.service.jobs.routing import can_run, describe_requirements, takes_queued_jobs
from enginecache.service.readmodels.liveness import ONLINE, alive_since

ACTIVE_JOB_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)


@dataclass(frozen=True)
class JobRow:
    id: int
    kind: str
    status: str
    progress: float
    phase: str | None
    worker: str | None
    attempts: int
    max_attempts: int
    error: str | None
    log_tail: str
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result_engine_id: int | None
    payload: dict[str, Any]
    requirements: dict[str, Any]


def _job_row(job: JobRecord) -> JobRow:
    return JobRow(
        id=job.id or 0,
        kind=job.kind,
        status=str(job.status),
        progress=float(job.progress),
        phase=job.phase,
        worker=job.lease_owner,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        error=job.error,
        log_tail=job.log_tail,
        cancel_requested=job.cancel_requested,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        result_engine_id=job.result_engine_id,
        payload=dict(job.payload),
        requirements=dict(job.requirements),
    )


def active_jobs(app: AppContext, *, limit: int = 50) -> list[JobRow]:
    """QUEUED and RUNNING jobs, oldest first (the order they run in)."""
    with app.catalog.read() as session:
        jobs = session.exec(
            select(JobRecord)
            .where(col(JobRecord.status).in_(ACTIVE_JOB_STATUSES))
            .order_by(col(JobRecord.id))
            .limit(limit)
        ).all()
    return [_job_row(j) for j in jobs]


def jobs_by_id(app: AppContext, job_ids: Sequence[int]) -> list[JobRow]:
    if not job_ids:
        return []
    with app.catalog.read() as session:
        jobs = session.exec(
            select(JobRecord).where(col(JobRecord.id).in_(list(job_ids))).order_by(col(JobRecord.id))
        ).all()
    return [_job_row(j) for j in jobs]


def active_jobs_by_key(app: AppContext, cache_keys: Sequence[str]) -> dict[str, JobRow]:
    """The QUEUED/RUNNING job for each of these cache keys, where one exists."""
    if not cache_keys:
        return {}
    with app.catalog.read() as session:
        jobs = session.exec(
            select(JobRecord).where(
                col(JobRecord.idempotency_key).in_(list(cache_keys)),
                col(JobRecord.status).in_(ACTIVE_JOB_STATUSES),
            )
        ).all()
    return {str(j.idempotency_key): _job_row(j) for j in jobs}


# -- the Build view's job list: recent jobs from the catalog, described by name ---------------

RECENT_JOBS_MAX = 200


@dataclass(frozen=True)
class JobView:
    """A job as the job list shows it: its row, the names it concerns, and (a QUEUED job no live
    worker can run) what is missing."""

    job: JobRow
    model_name: str | None  # the model built, or the model of the engine test-loaded
    engine_id: int | None  # a test-load's engine
    what: str  # "TensorRT-RTX fp16 sm89": what a build builds, or the engine a test-load loads
    needs: str | None  # "needs a worker with TensorRT-RTX 1.7.1 and an SM86 GPU": nobody live can run it

    @property
    def active(self) -> bool:
        return self.job.status in ACTIVE_JOB_STATUSES


def recent_jobs(
    app: AppContext,
    *,
    statuses: Sequence[str] = (),
    kinds: Sequence[str] = (),
    limit: int = 20,
) -> list[JobView]:
    """The newest jobs (any status unless `statuses` narrows it; any kind unless `kinds` does),
    newest first, with the model (and a test-load's engine) named, and for each QUEUED job no live
    worker can run, what it needs. Bounded by `limit`; three small queries besides the page."""
    limit = max(1, min(limit, RECENT_JOBS_MAX))
    query = select(JobRecord).order_by(col(JobRecord.id).desc()).limit(limit)
    if statuses:
        query = query.where(col(JobRecord.status).in_(list(statuses)))
    if kinds:
        query = query.where(col(JobRecord.kind).in_(list(kinds)))
    with app.catalog.read() as session:
        rows = [_job_row(j) for j in session.exec(query).all()]
        return _views(session, rows)


TEST_LOADS_SCANNED = 200


def engine_test_loads(app: AppContext, engine_id: int) -> list[JobView]:
    """An engine's test-load jobs that are QUEUED or RUNNING or that ended FAILED or DEAD (a run the
    worker could not record), newest first: the newest TEST_LOADS_SCANNED such jobs of any engine
    (ix_jobs_kind_status_finished), those of this one kept."""
    statuses = (*ACTIVE_JOB_STATUSES, JobStatus.FAILED, JobStatus.DEAD)
    query = (
        select(JobRecord)
        .where(col(JobRecord.kind) == "test_load", col(JobRecord.status).in_(statuses))
        .order_by(col(JobRecord.id).desc())
        .limit(TEST_LOADS_SCANNED)
    )
    with app.catalog.read() as session:
        rows = [_job_row(j) for j in session.exec(query).all()]
        return _views(session, [r for r in rows if _int(r.payload.get("engine_id")) == engine_id])


def _views(session: Any, rows: list[JobRow]) -> list[JobView]:
    """The rows described: model and engine names (two IN queries), and what a QUEUED job no live
    worker can run needs (one query of the live workers, where any row is QUEUED)."""
    engine_ids = {_int(r.payload.get("engine_id")) for r in rows} - {None}
    engines = {
        int(e.id): e
        for e in session.execute(
            sa.select(
                col(EngineRecord.id),
                col(EngineRecord.model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
            ).where(col(EngineRecord.id).in_(list(engine_ids)))
        ).all()
    }
    model_ids = {_int(r.payload.get("model")) for r in rows} | {int(e.model_id) for e in engines.values()}
    names = dict(
        session.execute(
            sa.select(col(ModelRecord.id), col(ModelRecord.name)).where(
                col(ModelRecord.id).in_([i for i in model_ids if i is not None])
            )
        ).all()
    )
    queued = any(r.status == JobStatus.QUEUED for r in rows)
    workers = (
        session.exec(
            select(WorkerRecord).where(
                col(WorkerRecord.heartbeat_at) >= alive_since(), col(WorkerRecord.status) == ONLINE
            )
        ).all()
        if queued
        else []
    )
    capabilities = [dict(w.capabilities) for w in workers if takes_queued_jobs(w.capabilities)]
    views = []
    for row in rows:
        engine = engines.get(_int(row.payload.get("engine_id")) or -1)
        model_id = int(engine.model_id) if engine is not None else _int(row.payload.get("model"))
        if engine is not None:
            what = f"{backend_label(str(engine.backend))} {engine.precision} {engine.targets}"
        else:
            what = " ".join(
                part
                for part in (
                    backend_label(str(row.payload["backend"])) if row.payload.get("backend") else "",
                    str(row.payload.get("precision") or ""),
                    ",".join(str(t) for t in row.payload.get("targets") or []),
                )
                if part
            )
        needs = None
        if row.status == JobStatus.QUEUED and not any(can_run(row.requirements, c) for c in capabilities):
            needs = f"needs {describe_requirements(row.requirements)}"
        views.append(
            JobView(
                job=row,
                model_name=str(names[model_id]) if model_id in names else None,
                engine_id=int(engine.id) if engine is not None else _int(row.payload.get("engine_id")),
                what=what,
                needs=needs,
            )
        )
    return views


def active_job_count(app: AppContext) -> int:
    """How many jobs are QUEUED or RUNNING (one count on ix_jobs_status_created)."""
    with app.catalog.read() as session:
        return int(
            session.execute(
                sa.select(sa.func.count()).select_from(JobRecord).where(col(JobRecord.status).in_(ACTIVE_JOB_STATUSES))
            ).scalar_one()
        )


def _int(value: Any) -> int | None:
    """An id as a payload holds it (an int, or a str of digits), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


@dataclass(frozen=True)
class FailedBuild:
    """The newest FAILED engine of a cache key: the build that failed before, and why."""

    engine_id: int
    job_id: int | None
    error: str


def failed_builds_by_key(app: AppContext, cache_keys: Sequence[str]) -> dict[str, FailedBuild]:
    """For each of these cache keys with a FAILED engine, the newest one (ix_engines_key_status)."""
    if not cache_keys:
        return {}
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(
                col(EngineRecord.cache_key), col(EngineRecord.id), col(EngineRecord.job_id), col(EngineRecord.error)
            )
            .where(col(EngineRecord.cache_key).in_(list(cache_keys)), col(EngineRecord.status) == EngineStatus.FAILED)
            .order_by(col(EngineRecord.id))
        ).all()
    out: dict[str, FailedBuild] = {}
    for key, engine_id, job_id, error in rows:  # ordered by id: the newest is written last
        out[str(key)] = FailedBuild(int(engine_id), job_id, error or "no reason recorded")
    return out
