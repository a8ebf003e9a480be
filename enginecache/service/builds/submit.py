"""Use cases for the queue: submit a build (idempotent by cache key), inspect, cancel, wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from enginecache.db import queue
from enginecache.db.models import (
    ACTIVE_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    EngineRecord,
    JobRecord,
    JobStatus,
    LoadEventRecord,
    WorkerRecord,
    utcnow,
)
from enginecache.db.queue import Clock
from enginecache.errors import JobWaitError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.builds.plan import BuildPlan, BuildRequest, find_ready_engine, plan_build
from enginecache.service.builds.whocan import live_workers as live_workers  # re-exported
from enginecache.service.builds.whocan import workers_that_can
from enginecache.service.context import AppContext
from enginecache.service.engines.events import record_event
from enginecache.service.jobs.routing import build_requirements, describe_requirements
from enginecache.service.readmodels.jobprogress import phase_words
from enginecache.service.readmodels.listing import job_dict

TERMINAL = TERMINAL_JOB_STATUSES


@dataclass(frozen=True)
class SubmitResult:
    """What a submission got: a READY engine (cache hit), a joined job, or a new job."""

    cache_hit: bool
    engine: EngineRecord | None
    job: JobRecord | None
    joined: bool
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "cache_hit": self.cache_hit,
            "engine_id": self.engine.id if self.engine else None,
            "job_id": self.job.id if self.job else None,
            "joined": self.joined,
            "status": self.job.status if self.job else "READY",
            "notes": list(self.notes),
        }


def request_payload(request: BuildRequest, model_id: int) -> dict[str, Any]:
    data = asdict(request)
    data["model"] = str(model_id)
    data["targets"] = list(request.targets)
    data["profiles"] = list(request.profiles)
    data["calibration"] = str(request.calibration) if request.calibration else None
    return data


def request_from_payload(payload: dict[str, Any]) -> BuildRequest:
    return BuildRequest(
        model=str(payload["model"]),
        backend=payload["backend"],
        targets=tuple(payload["targets"]),
        precision=payload["precision"],
        profiles=tuple(payload["profiles"]),
        calibration=Path(payload["calibration"]) if payload.get("calibration") else None,
        converter=payload.get("converter"),
        opt_level=payload.get("opt_level"),
        workspace_bytes=payload.get("workspace_bytes"),
    )


def plan_requirements(plan: BuildPlan) -> dict[str, Any]:
    """What a worker must have to run the build job of `plan` (`routing.build_requirements`): what
    `submit_build` gives the job, and what the dashboard asks `whocan.blocked_build` about."""
    return build_requirements(plan.backend.name, plan.target_info, plan.backend_version, plan.ingredients["os"])


def submit_build(
    app: AppContext, request: BuildRequest, *, max_attempts: int = 3, timeout_seconds: float = 3600.0
) -> SubmitResult:
    """Validate the request, then return its READY engine, join its active job, or enqueue one.

    A calibration file is copied into the store first, so the job does not depend on a path
    that only exists in the submitter's working directory.
    """
    access.require(app, "build")
    started = time.perf_counter()
    plan = plan_build(app, request)
    ready = find_ready_engine(app, plan.cache_key)
    if ready is not None:
        _record_request(app, plan, "hit", started, engine_id=ready.id)
        return SubmitResult(cache_hit=True, engine=ready, job=None, joined=False, notes=plan.notes)
    if request.calibration is not None:
        blob = app.store.ingest_file(request.calibration)
        request = BuildRequest(**{**asdict(request), "calibration": blob.path})
    result = queue.enqueue(
        app.catalog,
        kind="build",
        payload=request_payload(request, plan.model.id or 0),
        requirements=plan_requirements(plan),
        idempotency_key=plan.cache_key,
        max_attempts=max_attempts,
        timeout_seconds=timeout_seconds,
        submitted_by=audit.current_actor().name,
    )
    _record_request(app, plan, "joined" if result.joined else "queued", started)
    if not result.joined:
        audit.record(
            app,
            audit.BUILD_SUBMIT,
            f"model {plan.model.id}",
            {
                "job_id": result.job.id,
                "model": plan.model.name,
                "backend": plan.backend.name,
                "precision": plan.precision.precision,
                "targets": list(plan.targets),
                "cache_key": plan.cache_key,
            },
        )
    return SubmitResult(cache_hit=False, engine=None, job=result.job, joined=result.joined, notes=plan.notes)


def failed_earlier(app: AppContext, cache_key: str) -> JobRecord | None:
    """The build job that last tried this cache key, where it ended FAILED: a deterministic failure
    (service.builds.buildjob), which the same key (the same model bytes, backend and its version,
    target, precision recipe, build options and OS: core.cachekey) fails again the same way. None
    where the newest such job ended otherwise (SUCCEEDED; DEAD, out of attempts at transient
    failures; CANCELLED), is still active, or there is none: then a build is worth trying."""
    job = queue.latest_job_by_key(app.catalog, "build", cache_key)
    return job if job is not None and job.status == JobStatus.FAILED else None


def _record_request(
    app: AppContext, plan: BuildPlan, outcome: str, started: float, *, engine_id: int | None = None
) -> None:
    seconds = time.perf_counter() - started
    record_event(
        app,
        LoadEventRecord(
            source="build_request",
            hostname=plan.host.hostname,
            model_name=plan.model.name,
            model_id=plan.model.id,
            engine_id=engine_id,
            backend=plan.backend.name,
            precision=plan.precision.precision,
            host_target=",".join(plan.targets),
            outcome=outcome,
            lookup_s=seconds,
            total_s=seconds,
        ),
    )


def capable_workers(app: AppContext, job: JobRecord, *, clock: Clock = utcnow) -> list[WorkerRecord]:
    """Live workers that take queued jobs generally and can run this one (`whocan.workers_that_can`):
    another CLI's one-shot worker claims only its own job, so it never counts here."""
    return workers_that_can(app, job.requirements, clock=clock)


def waiting_reason(app: AppContext, job: JobRecord) -> str | None:
    """For a QUEUED job no live worker can run: 'waiting for a worker with TensorRT and an SM86 GPU'."""
    if job.status != JobStatus.QUEUED or capable_workers(app, job):
        return None
    return f"waiting for {describe_requirements(job.requirements)}"


def job_to_dict(app: AppContext | None, job: JobRecord) -> dict[str, Any]:
    """`service.readmodels.listing.job_dict`, with `waiting` when `app` is given."""
    if app is None:
        return job_dict(job)
    return job_dict(job, waiting_reason(app, job))


def cancel_job(app: AppContext, job_id: int) -> JobRecord:
    """Cancel a QUEUED job at once, or ask a RUNNING one's worker to stop it; a job already finished,
    or already asked, is left as it is (and nothing is recorded)."""
    access.require(app, "cancel")
    before = queue.get_job(app.catalog, job_id)
    job = queue.request_cancel(app.catalog, job_id)
    if before.status in ACTIVE_JOB_STATUSES and not before.cancel_requested:
        details = {"kind": job.kind, "was": before.status, "status": job.status}
        audit.record(app, audit.JOB_CANCEL, f"job {job_id}", details)
    return job


def get_job(app: AppContext, job_id: int) -> JobRecord:
    return queue.get_job(app.catalog, job_id)


def list_jobs(app: AppContext, *, status: str | None = None, limit: int = 200) -> list[JobRecord]:
    return queue.list_jobs(app.catalog, status=status, limit=limit)


def wait_for_job(
    app: AppContext,
    job_id: int,
    *,
    on_update: Callable[[JobRecord], None] | None = None,
    on_poll: Callable[[JobRecord], None] | None = None,
    poll_seconds: float | Callable[[], float] = 0.2,
    timeout_seconds: float | None = None,
) -> JobRecord:
    """Poll a job until it is terminal, reporting each change of progress or phase (`on_update`).

    `on_poll` sees the unfinished job at every poll and may raise to stop waiting; `poll_seconds`
    may be a function, asked before each sleep (a wait that starts running the job polls faster). With
    `timeout_seconds`, a job still unfinished then raises JobWaitError naming the job and what it
    was waiting for; the job itself is left as it is.
    """
    deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
    last: tuple[Any, ...] | None = None
    while True:
        job = get_job(app, job_id)
        state = (job.status, job.phase, round(job.progress, 3), job.attempts)
        if state != last and on_update is not None:
            on_update(job)
        last = state
        if job.status in TERMINAL:
            return job
        if deadline is not None and time.monotonic() >= deadline:
            waited_for = _describe_wait(app, job)
            raise JobWaitError(
                f"gave up waiting for job {job_id} after {timeout_seconds:g} s: it is {waited_for}",
                job_id=job_id,
                waited_for=waited_for,
                seconds=timeout_seconds,
            )
        if on_poll is not None:
            on_poll(job)
        time.sleep(poll_seconds() if callable(poll_seconds) else poll_seconds)


def _describe_wait(app: AppContext, job: JobRecord) -> str:
    """What an unfinished job is waiting for: 'QUEUED, waiting for a worker with ...', or 'RUNNING
    on worker w1 (attempt 1/3, 40%, phase build)'."""
    if job.status == JobStatus.RUNNING:
        detail = f"attempt {job.attempts}/{job.max_attempts}, {job.progress:.0%}, {phase_words(job.status, job.phase)}"
        return f"{job.status} on worker {job.lease_owner or '?'} ({detail})"
    reason = waiting_reason(app, job)
    if reason is not None:
        return f"{job.status}, {reason}"
    return (
        f"{job.status} after {job.attempts}/{job.max_attempts} attempts; a live worker can run it but has not "
        "claimed it yet (busy, or a retry's backoff)"
    )
