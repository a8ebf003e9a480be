"""The waits of `build`/`test-load` (service.builds.submitwait.run_and_wait) that end before their job does:
a timeout naming the job and what it waits for, a job nobody can run refused and cancelled, this
host's worker stopped or failed."""

from __future__ import annotations

import threading

import pytest

from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import (
    EXIT_FAILED,
    JobWaitError,
    exit_code_for,
)
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.context import AppContext
from enginecache.service.jobs.worker import Worker


def _live_worker_elsewhere(app: AppContext) -> None:
    queue.register_worker(
        app.catalog, name="elsewhere", hostname="elsewhere", pid=1, fingerprint={}, capabilities={"backends": ["rtx"]}
    )


def test_wait_timeout_names_the_job_and_what_it_waits_for(app_ctx: AppContext) -> None:
    _live_worker_elsewhere(app_ctx)  # a live worker can run it: nothing starts here
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "rtx"}).job
    with pytest.raises(JobWaitError) as caught:
        run_and_wait(app_ctx, job, timeout_seconds=0.3, poll_seconds=0.05)
    err = caught.value
    assert err.timed_out and err.seconds == 0.3 and err.job_id == job.id
    assert str(err).startswith(f"gave up waiting for job {job.id} after 0.3 s: it is QUEUED")
    assert "a live worker can run it" in err.waited_for
    assert exit_code_for(err) == EXIT_FAILED
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.QUEUED, "left as it is"


def test_a_job_nobody_can_run_is_refused_and_cancelled(app_ctx: AppContext) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "none-such"}).job
    with pytest.raises(JobWaitError, match=rf"no worker can run build job {job.id}: it needs a worker with none-such"):
        run_and_wait(app_ctx, job)
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.CANCELLED


def test_wait_timeout_stops_this_hosts_worker_and_leaves_the_job_queued(app_ctx: AppContext) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "rtx"}).job
    with pytest.raises(JobWaitError, match="this host's worker has stopped, the job is QUEUED") as caught:
        run_and_wait(app_ctx, job, timeout_seconds=0.0)
    assert caught.value.timed_out
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.QUEUED
    assert not [t for t in threading.enumerate() if t.name.startswith("enginecache-oneshot-job-")]


def test_a_failed_local_worker_ends_the_wait_with_its_error(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_self: Worker) -> int:
        raise RuntimeError("claim exploded")

    monkeypatch.setattr(Worker, "run", broken)
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "rtx"}).job
    with pytest.raises(JobWaitError, match=r"worker for job \d+ stopped before the job finished \(RuntimeError: claim"):
        run_and_wait(app_ctx, job, timeout_seconds=60, poll_seconds=0.05)
