"""Jobs' read models (Build's matrix and live progress): queued and running jobs, jobs by id, the
active job of each cache key."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import col, select

from enginecache.db.models import JobRecord, JobStatus
from enginecache.service.context import AppContext

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
