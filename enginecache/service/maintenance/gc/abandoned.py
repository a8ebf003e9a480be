"""PENDING engine rows no build will finish, which `enginecache gc` marks FAILED with the reason in
`error`: those whose job is terminal or gone, whose job has moved past the attempt that made them
(queued again, or another attempt running), or that have no job and are older than the pending age
(default 24 hours)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlmodel import col

from enginecache.db import engines as lifecycle
from enginecache.db.models import TERMINAL_JOB_STATUSES, EngineRecord, EngineStatus, JobRecord, JobStatus
from enginecache.service.context import AppContext
from enginecache.service.maintenance.gc.report import AbandonedEngine, GcPolicy, describe_age

logger = logging.getLogger(__name__)


def find_abandoned_engines(app: AppContext, now: datetime, policy: GcPolicy) -> list[AbandonedEngine]:
    """PENDING engine rows that no build will finish (see the module docstring)."""
    query = (
        sa.select(
            col(EngineRecord.id),
            col(EngineRecord.job_id),
            col(EngineRecord.job_attempt),
            col(EngineRecord.created_at),
            col(JobRecord.id),
            col(JobRecord.status),
            col(JobRecord.attempts),
        )
        .select_from(EngineRecord)
        .outerjoin(JobRecord, col(JobRecord.id) == col(EngineRecord.job_id))
        .where(col(EngineRecord.status) == EngineStatus.PENDING)
        .order_by(col(EngineRecord.id))
    )
    found = []
    with app.catalog.read() as session:
        for engine_id, job_id, attempt, created_at, job_found, job_status, job_attempts in session.execute(query):
            reason = _abandoned_because(
                job_id, attempt, now - created_at, job_found is not None, job_status, job_attempts, policy
            )
            if reason is not None:
                found.append(AbandonedEngine(engine_id, job_id, reason))
    return found


def _abandoned_because(
    job_id: int | None,
    attempt: int | None,
    age: timedelta,
    job_found: bool,
    job_status: str | None,
    job_attempts: int | None,
    policy: GcPolicy,
) -> str | None:
    if job_id is None:
        if age < policy.pending_age:
            return None  # a build in a process of its own (build_engine) may still be running
        return f"no job builds it and it has been PENDING for {describe_age(age)}"
    if not job_found:
        return f"its job {job_id} is gone"
    if job_status in TERMINAL_JOB_STATUSES:
        return f"its job {job_id} is {job_status}"
    if job_status == JobStatus.RUNNING:
        if attempt is None or attempt == job_attempts:
            return None  # that attempt is running
        return f"job {job_id} is running attempt {job_attempts}; this row is attempt {attempt}'s"
    return f"attempt {attempt} of job {job_id} has ended (the job is {job_status})"


def mark_abandoned_engines(app: AppContext, engines: list[AbandonedEngine], now: datetime) -> list[AbandonedEngine]:
    """Mark each still-PENDING row FAILED (a conditional update: a row a build finished meanwhile
    keeps its status); the ones marked."""
    marked: list[AbandonedEngine] = []
    if not engines:
        return marked
    with app.catalog.changes() as ex:
        for engine in engines:
            error = f"abandoned (found by gc): {engine.reason}"
            if lifecycle.mark_failed(ex, engine.engine_id, error, at=now, only_pending=True) == EngineStatus.PENDING:
                marked.append(engine)
    for engine in marked:
        logger.info("engine %s: PENDING -> FAILED, %s", engine.engine_id, engine.reason)
    return marked
