"""Wait for a submitted job, running it on this host when no live worker can.

What `enginecache build` and `enginecache test-load` do without `--queue`: the job goes through the
queue either way, so a live worker that can run it does; otherwise a one-shot worker in this process
claims just that job and runs it through the same worker code (child process, lease, heartbeat).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from enginecache.db.models import JobRecord
from enginecache.errors import BadInputError, JobWaitError
from enginecache.service.context import AppContext
from enginecache.service.jobs import TERMINAL, cancel_job, capable_workers, get_job, wait_for_job
from enginecache.service.routing import can_run, describe_requirements
from enginecache.service.worker import Worker, WorkerConfig, default_worker_name

logger = logging.getLogger(__name__)

WAIT_SLACK_SECONDS = 600.0  # beyond the job's own attempts: claims, retry backoff, a busy worker
LOCAL_WORKER_STOP_SECONDS = 30.0  # how long to wait for this host's worker to hand a job back


def wait_budget(job: JobRecord) -> float:
    """The default wait for a job: every attempt may run to its own timeout, plus slack."""
    return job.max_attempts * job.timeout_seconds + WAIT_SLACK_SECONDS


def run_and_wait(
    app: AppContext,
    job: JobRecord,
    *,
    on_update: Callable[[JobRecord], None] | None = None,
    timeout_seconds: float | None = None,
    poll_seconds: float = 0.2,
) -> JobRecord:
    """Wait for a submitted job to finish; when no live worker can run it, run it here.

    Returns the terminal job (SUCCEEDED, FAILED, DEAD or CANCELLED: the caller judges the outcome).
    `on_update` sees each change of status, phase or progress. Raises JobWaitError when no live
    worker and not this host can run the job (it is cancelled rather than left queued for nobody),
    or when `timeout_seconds` (default `wait_budget(job)`) runs out: the job is left queued, and an
    attempt this host's worker was running is handed back to the queue first.
    """
    if job.id is None:
        raise BadInputError("run_and_wait needs a submitted job (one with an id)")
    job_id = job.id
    budget = wait_budget(job) if timeout_seconds is None else timeout_seconds
    if job.status in TERMINAL or capable_workers(app, job):
        return wait_for_job(app, job_id, on_update=on_update, poll_seconds=poll_seconds, timeout_seconds=budget)
    local = _LocalWorker(app, job_id)
    if not can_run(job.requirements, local.worker.capabilities):
        cancel_job(app, job_id)
        needs = describe_requirements(job.requirements)
        raise JobWaitError(
            f"no worker can {_task(job)}: it needs {needs}; this host cannot either (job {job_id} cancelled)",
            job_id=job_id,
            waited_for=needs,
        )
    local.start()
    finished = False
    try:
        done = wait_for_job(
            app, job_id, on_update=on_update, on_poll=local.check, poll_seconds=poll_seconds, timeout_seconds=budget
        )
        finished = True
        return done
    except JobWaitError as err:
        if not err.timed_out:
            raise
        local.stop(hand_back=True)
        raise JobWaitError(
            f"{err}; this host's worker has stopped, the job is {get_job(app, job_id).status}",
            job_id=job_id,
            waited_for=err.waited_for,
            seconds=err.seconds,
        ) from None
    finally:
        local.stop(hand_back=not finished)


def _task(job: JobRecord) -> str:
    if job.kind == "test_load":
        return f"load engine {job.payload.get('engine_id')}"
    return f"run {job.kind} job {job.id}"


class _LocalWorker:
    """A one-shot worker for one job, in a thread of this process."""

    def __init__(self, app: AppContext, job_id: int) -> None:
        self.app = app
        self.job_id = job_id
        self.worker = Worker(app, WorkerConfig(name=f"oneshot-{default_worker_name()}", job_id=job_id))
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"enginecache-oneshot-job-{job_id}", daemon=True)
        self._stopped = False

    def _run(self) -> None:
        try:
            self.worker.run()
        except Exception as err:  # kept for check(): the wait ends with it instead of running on
            self.error = err
            logger.exception("one-shot worker %s failed", self.worker.config.name)

    def start(self) -> None:
        self._thread.start()

    def check(self, job: JobRecord) -> None:
        """While waiting: raise JobWaitError once the worker has ended with its job unfinished."""
        if self._thread.is_alive():
            return
        current = get_job(self.app, self.job_id)  # it may have finished the job just now
        if current.status in TERMINAL:
            return
        reason = f"{type(self.error).__name__}: {self.error}" if self.error else "it ended"
        raise JobWaitError(
            f"this host's worker for job {self.job_id} stopped before the job finished ({reason}); "
            f"the job is {current.status}",
            job_id=self.job_id,
            waited_for=f"this host's worker {self.worker.config.name}",
        )

    def stop(self, *, hand_back: bool) -> None:
        """Let the worker end (it does by itself once its job is terminal), or with `hand_back`
        kill the attempt it runs and return the job to the queue."""
        if self._stopped or not self._thread.is_alive():
            return
        self._stopped = True
        if hand_back:
            self.worker.request_stop(hard=True)
        self._thread.join(LOCAL_WORKER_STOP_SECONDS)
        if self._thread.is_alive():
            logger.warning(
                "one-shot worker %s did not stop in %g s", self.worker.config.name, LOCAL_WORKER_STOP_SECONDS
            )
