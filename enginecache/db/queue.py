"""The job queue in the catalog: enqueue with idempotency, atomic claim under a lease,
heartbeat, progress, completion and cancel. Every write by a job holder names its lease token
and is rejected (StaleLeaseError) once the token is no longer the job's.

Claim is atomic: `SELECT ... FOR UPDATE SKIP LOCKED` on PostgreSQL, and an immediate
transaction (one writer at a time) on SQLite. A RUNNING job whose lease expired is claimable
again (its holder stalled or died); each claim counts an attempt, and a job out of attempts
is DEAD with its last error.

Every function that reads the time takes it from `clock` (keyword, default `utcnow`): a test
passes a controlled clock (as huey's `time_function`) and moves it instead of sleeping past a
lease or a backoff. Times are aware UTC datetimes; a claim reads the clock once it holds the
write lock, so a lease starts when it is granted, not when the claim began waiting for it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.db.catalog import Catalog
from enginecache.db.models import ACTIVE_JOB_STATUSES, JobRecord, JobStatus, WorkerRecord, utcnow
from enginecache.errors import NotFoundError, StaleLeaseError

Clock = Callable[[], datetime]  # an aware UTC datetime, "now"

CLAIM_SCAN = 5000  # runnable jobs looked at per claim, oldest first
LOG_TAIL_CHARS = 4000


@dataclass(frozen=True)
class EnqueueResult:
    job: JobRecord
    joined: bool  # an active job with the same key existed and was returned


@dataclass(frozen=True)
class Lease:
    job: JobRecord
    token: str


def enqueue(
    catalog: Catalog,
    *,
    kind: str,
    payload: Mapping[str, Any],
    requirements: Mapping[str, Any],
    idempotency_key: str | None = None,
    max_attempts: int = 3,
    timeout_seconds: float = 3600.0,
    submitted_by: str | None = None,
    clock: Clock = utcnow,
) -> EnqueueResult:
    """Add a job, or join the QUEUED/RUNNING job that has the same idempotency key (whose
    `submitted_by` stays the first submitter's)."""
    for _ in range(3):
        try:
            with catalog.write() as session:
                if idempotency_key is not None:
                    active = _active_by_key(session, idempotency_key)
                    if active is not None:
                        return EnqueueResult(active, joined=True)
                now = clock()
                job = JobRecord(
                    kind=kind,
                    idempotency_key=idempotency_key,
                    payload=dict(payload),
                    requirements=dict(requirements),
                    max_attempts=max_attempts,
                    timeout_seconds=timeout_seconds,
                    submitted_by=submitted_by,
                    run_after=now,
                    created_at=now,
                    updated_at=now,
                )
                session.add(job)
            return EnqueueResult(job, joined=False)
        except sa.exc.IntegrityError:
            continue  # a concurrent submission inserted the same key first: join it
    with catalog.read() as session:
        active = _active_by_key(session, idempotency_key or "")
    if active is None:
        raise NotFoundError(f"job with key {idempotency_key} vanished while joining it")
    return EnqueueResult(active, joined=True)


def _active_by_key(session: Any, key: str) -> JobRecord | None:
    found: JobRecord | None = session.exec(
        select(JobRecord).where(JobRecord.idempotency_key == key, col(JobRecord.status).in_(ACTIVE_JOB_STATUSES))
    ).first()
    return found


def claim(
    catalog: Catalog,
    *,
    worker: str,
    can_run: Callable[[Mapping[str, Any]], bool],
    lease_seconds: float,
    job_id: int | None = None,
    kinds: tuple[str, ...] | None = None,
    clock: Clock = utcnow,
) -> Lease | None:
    """Claim the oldest runnable job this worker can run (or `job_id` only), under a new lease.

    Candidates are read without locks (ids and requirements only) and filtered by `can_run`, so a
    backlog of jobs this worker cannot run neither hides newer ones from it nor gets locked by it;
    only the chosen row is locked (`FOR UPDATE SKIP LOCKED` on PostgreSQL), re-checked, claimed.
    The lease (and the attempt's `started_at`, from which its timeout counts) starts at the time
    read once the transaction holds the write lock (SQLite's `BEGIN IMMEDIATE` may wait for it).
    """
    with catalog.write() as session:
        session.connection()  # BEGIN now (IMMEDIATE on SQLite): the clock is read after any wait for the lock
        now = clock()
        runnable = sa.or_(
            sa.and_(col(JobRecord.status) == JobStatus.QUEUED, col(JobRecord.run_after) <= now),
            sa.and_(col(JobRecord.status) == JobStatus.RUNNING, col(JobRecord.lease_expires_at) < now),
        )
        query = (
            sa.select(
                col(JobRecord.id),
                col(JobRecord.requirements),
                col(JobRecord.cancel_requested) | (col(JobRecord.attempts) >= col(JobRecord.max_attempts)),
            )
            .where(runnable)
            .order_by(col(JobRecord.id))
        )
        if job_id is not None:
            query = query.where(col(JobRecord.id) == job_id)
        if kinds is not None:
            query = query.where(col(JobRecord.kind).in_(kinds))
        for candidate_id, requirements, to_settle in session.execute(query.limit(CLAIM_SCAN)).all():
            if not to_settle and not can_run(requirements):
                continue  # never locked: another worker may run it
            locked = select(JobRecord).where(col(JobRecord.id) == candidate_id, runnable)
            if not catalog.is_sqlite:
                locked = locked.with_for_update(skip_locked=True)
            job = session.exec(locked).first()
            if job is None:  # claimed, finished or locked by another worker meanwhile
                continue
            if job.status == JobStatus.RUNNING and job.attempts >= job.max_attempts:
                error = job.error or "no error recorded"
                _finish(job, JobStatus.DEAD, f"lease of {job.lease_owner} expired on the last attempt ({error})", now)
                session.add(job)
                continue
            if job.cancel_requested:
                _finish(job, JobStatus.CANCELLED, "cancelled", now)
                session.add(job)
                continue
            if not can_run(job.requirements):
                continue
            token = uuid.uuid4().hex
            job.status = JobStatus.RUNNING
            job.lease_owner = worker
            job.lease_token = token
            job.lease_expires_at = now + timedelta(seconds=lease_seconds)
            job.attempts += 1
            job.started_at = now
            job.finished_at = None
            job.progress = 0.0
            job.phase = "claimed"
            job.updated_at = now
            session.add(job)
            return Lease(job, token)
    return None


def _holder(session: Any, job_id: int, token: str) -> JobRecord:
    job: JobRecord | None = session.get(JobRecord, job_id, with_for_update=not _is_sqlite(session))
    if job is None:
        raise NotFoundError(f"no job {job_id}")
    if job.lease_token != token or job.status != JobStatus.RUNNING:
        raise StaleLeaseError(
            f"job {job_id}: lease token is stale (job is {job.status}, held by {job.lease_owner}); write rejected"
        )
    return job


def _is_sqlite(session: Any) -> bool:
    return bool(session.get_bind().dialect.name == "sqlite")


def heartbeat(catalog: Catalog, job_id: int, token: str, lease_seconds: float, *, clock: Clock = utcnow) -> bool:
    """Extend the lease; returns whether a cancel was requested. StaleLeaseError if lost."""
    with catalog.write() as session:
        job = _holder(session, job_id, token)
        now = clock()
        job.lease_expires_at = now + timedelta(seconds=lease_seconds)
        job.updated_at = now
        session.add(job)
        return job.cancel_requested


def set_runner(catalog: Catalog, job_id: int, token: str, pid: int, *, clock: Clock = utcnow) -> None:
    """Record the pid of the child process running the held attempt."""
    with catalog.write() as session:
        job = _holder(session, job_id, token)
        job.runner_pid = pid
        job.updated_at = clock()
        session.add(job)


def report_progress(
    catalog: Catalog,
    job_id: int,
    token: str,
    *,
    progress: float | None = None,
    phase: str | None = None,
    log_tail: str | None = None,
    clock: Clock = utcnow,
) -> None:
    with catalog.write() as session:
        job = _holder(session, job_id, token)
        if progress is not None:
            job.progress = max(0.0, min(1.0, progress))
        if phase is not None:
            job.phase = phase
        if log_tail is not None:
            job.log_tail = log_tail[-LOG_TAIL_CHARS:]
        job.updated_at = clock()
        session.add(job)


def _finish(job: JobRecord, status: str, error: str | None, now: datetime) -> None:
    job.status = status
    job.error = error
    job.finished_at = now
    job.updated_at = now
    job.lease_token = None
    job.lease_expires_at = None
    job.runner_pid = None


def complete(
    catalog: Catalog,
    job_id: int,
    token: str,
    *,
    status: str,
    error: str | None = None,
    result_engine_id: int | None = None,
    on_commit: Callable[[Any], None] | None = None,
    clock: Clock = utcnow,
) -> JobRecord:
    """Finish a held job (SUCCEEDED, FAILED or CANCELLED). `on_commit(session)` runs in the
    same transaction, so related rows change only if the lease is still valid."""
    with catalog.write() as session:
        job = _holder(session, job_id, token)
        _finish(job, status, error, clock())
        job.result_engine_id = result_engine_id
        if status == JobStatus.SUCCEEDED:
            job.progress = 1.0
        if on_commit is not None:
            on_commit(session)
        session.add(job)
        return job


def fail_attempt(
    catalog: Catalog,
    job_id: int,
    token: str,
    *,
    error: str,
    backoff_seconds: float,
    on_commit: Callable[[Any], None] | None = None,
    clock: Clock = utcnow,
) -> JobRecord:
    """A transient failure: retry after a backoff, or DEAD when out of attempts."""
    with catalog.write() as session:
        job = _holder(session, job_id, token)
        if on_commit is not None:
            on_commit(session)
        now = clock()
        if job.attempts >= job.max_attempts:
            _finish(job, JobStatus.DEAD, f"attempt {job.attempts} of {job.max_attempts} failed: {error}", now)
        else:
            _finish(job, JobStatus.QUEUED, f"attempt {job.attempts} failed: {error}", now)
            job.finished_at = None
            job.run_after = now + timedelta(seconds=backoff_seconds)
        session.add(job)
        return job


def release(catalog: Catalog, job_id: int, token: str, *, clock: Clock = utcnow) -> JobRecord:
    """Hand a held job back to the queue without counting the attempt (worker shutting down)."""
    with catalog.write() as session:
        job = _holder(session, job_id, token)
        now = clock()
        _finish(job, JobStatus.QUEUED, job.error, now)
        job.finished_at = None
        job.attempts = max(0, job.attempts - 1)
        job.phase = "handed back"
        job.run_after = now
        session.add(job)
        return job


def request_cancel(catalog: Catalog, job_id: int, *, clock: Clock = utcnow) -> JobRecord:
    """QUEUED: cancelled at once. RUNNING: flagged; its worker kills the child and confirms."""
    with catalog.write() as session:
        job: JobRecord | None = session.get(JobRecord, job_id)
        if job is None:
            raise NotFoundError(f"no job {job_id}")
        if job.status == JobStatus.QUEUED:
            _finish(job, JobStatus.CANCELLED, "cancelled before it ran", clock())
        elif job.status == JobStatus.RUNNING:
            job.cancel_requested = True
            job.updated_at = clock()
        session.add(job)
        return job


def get_job(catalog: Catalog, job_id: int) -> JobRecord:
    with catalog.read() as session:
        job = session.get(JobRecord, job_id)
    if job is None:
        raise NotFoundError(f"no job with id {job_id} in the catalog")
    return job


def latest_job_by_key(catalog: Catalog, kind: str, key: str) -> JobRecord | None:
    """The newest job of `kind` submitted under idempotency key `key`, in any status; None for none."""
    query = (
        select(JobRecord)
        .where(JobRecord.kind == kind, JobRecord.idempotency_key == key)
        .order_by(col(JobRecord.id).desc())
        .limit(1)
    )
    with catalog.read() as session:
        return session.exec(query).first()


def list_jobs(catalog: Catalog, *, status: str | None = None, limit: int = 200) -> list[JobRecord]:
    query = select(JobRecord).order_by(col(JobRecord.id).desc()).limit(limit)
    if status is not None:
        query = query.where(JobRecord.status == status.upper())
    with catalog.read() as session:
        return list(session.exec(query).all())


# -- workers ----------------------------------------------------------------------------


def register_worker(
    catalog: Catalog,
    *,
    name: str,
    hostname: str,
    pid: int,
    fingerprint: Mapping[str, Any],
    capabilities: Mapping[str, Any],
    clock: Clock = utcnow,
) -> WorkerRecord:
    with catalog.write() as session:
        worker = session.exec(select(WorkerRecord).where(WorkerRecord.name == name)).first()
        now = clock()
        if worker is None:
            worker = WorkerRecord(name=name, hostname=hostname, pid=pid)
        worker.hostname = hostname
        worker.pid = pid
        worker.fingerprint = dict(fingerprint)
        worker.capabilities = dict(capabilities)
        worker.status = "online"
        worker.started_at = now
        worker.heartbeat_at = now
        worker.current_job_id = None
        session.add(worker)
        return worker


def worker_heartbeat(
    catalog: Catalog, name: str, *, current_job_id: int | None, status: str = "online", clock: Clock = utcnow
) -> None:
    with catalog.write() as session:
        worker = session.exec(select(WorkerRecord).where(WorkerRecord.name == name)).first()
        if worker is None:
            raise NotFoundError(f"no worker {name!r}")
        worker.heartbeat_at = clock()
        worker.current_job_id = current_job_id
        worker.status = status
        session.add(worker)


def list_workers(catalog: Catalog, *, alive_since: datetime | None = None) -> list[WorkerRecord]:
    """All workers, newest heartbeat first; with `alive_since`, those online (not stopping or
    offline) that beat since then: the ones that may claim a new job."""
    query = select(WorkerRecord).order_by(col(WorkerRecord.heartbeat_at).desc())
    if alive_since is not None:
        query = query.where(col(WorkerRecord.heartbeat_at) >= alive_since, WorkerRecord.status == "online")
    with catalog.read() as session:
        return list(session.exec(query).all())
