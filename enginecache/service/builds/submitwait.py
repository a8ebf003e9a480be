"""Wait for a submitted job, running it on this host when no live worker can.

What `enginecache build` and `enginecache test-load` do without `--queue`: the job goes through the
queue either way, so a live worker that can run it does; otherwise a one-shot worker in this process
claims just that job and runs it through the same worker code (child process, lease, heartbeat).

The one-shot worker starts nothing it does not need: no fresh interpreter (seconds for one job). Its
attempts run in children of a `service.jobs.zygote.Zygote`, a fork of this process made while it has
one thread, which imports only the job's backend library, while the worker claims the job; where
this process already runs other threads (a fork is unsafe then), the worker chooses for itself
(`Worker.run`). It polls the job more often than a waiting client.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable

from enginecache.core.backends.registry import BACKENDS
from enginecache.core.fingerprint import host_fingerprint
from enginecache.core.processes import fork_hazard
from enginecache.db.models import JobRecord, JobStatus
from enginecache.errors import BadInputError, JobWaitError
from enginecache.service.builds.submit import TERMINAL, cancel_job, capable_workers, get_job, wait_for_job
from enginecache.service.context import AppContext
from enginecache.service.jobs.routing import can_run, describe_requirements, worker_capabilities
from enginecache.service.jobs.worker import Worker, WorkerConfig, default_worker_name, lease_seconds_from_env
from enginecache.service.jobs.zygote import Zygote

logger = logging.getLogger(__name__)

WAIT_SLACK_SECONDS = 600.0  # beyond the job's own attempts: claims, retry backoff, a busy worker
LOCAL_WORKER_STOP_SECONDS = 30.0  # how long to wait for this host's worker to hand a job back
LOCAL_POLL_SECONDS = 0.05  # how often the wait reads a job this process runs (a catalog read each time)
RECHECK_SECONDS = 1.0  # how often a wait re-asks whether a live worker can run its job


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
    if job.status in TERMINAL:
        return wait_for_job(app, job_id, on_update=on_update, poll_seconds=poll_seconds, timeout_seconds=budget)
    runner = _RunHereWhenNobodyCan(app, job)
    runner.reconsider(job, force=True)  # raises at once when nobody, this host included, can run it
    finished = False
    try:
        done = wait_for_job(
            app,
            job_id,
            on_update=on_update,
            on_poll=runner.reconsider,
            poll_seconds=lambda: min(poll_seconds, LOCAL_POLL_SECONDS) if runner.local else poll_seconds,
            timeout_seconds=budget,
        )
        finished = True
        return done
    except JobWaitError as err:
        if not err.timed_out or runner.local is None:
            raise
        runner.local.stop(hand_back=True)
        raise JobWaitError(
            f"{err}; this host's worker has stopped, the job is {get_job(app, job_id).status}",
            job_id=job_id,
            waited_for=err.waited_for,
            seconds=err.seconds,
        ) from None
    finally:
        if runner.local is not None:
            runner.local.stop(hand_back=not finished)


class _RunHereWhenNobodyCan:
    """Re-asks, while a job waits, "can a live worker run it?", and starts this host's one-shot worker
    the first time the answer is no: at once, or later when the worker it waited on has gone (its
    liveness lease ran out, so its attempt's lease runs out too and the job is claimable again)."""

    def __init__(self, app: AppContext, job: JobRecord) -> None:
        self.app = app
        self.job_id = job.id or 0
        self.local: _LocalWorker | None = None
        self._next_check = 0.0

    def reconsider(self, job: JobRecord, *, force: bool = False) -> None:
        if self.local is not None:
            self.local.check(job)
            return
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self._next_check = now + RECHECK_SECONDS
        if capable_workers(self.app, job) or not _claimable_soon(job):
            return
        local = _LocalWorker(self.app, job)
        if not can_run(job.requirements, local.capabilities):
            if not force:
                return  # a capable worker went away: wait on (to the budget) for one to come back
            cancel_job(self.app, self.job_id)
            needs = describe_requirements(job.requirements)
            raise JobWaitError(
                f"no worker can {_task(job)}: it needs {needs}; this host cannot either (job {self.job_id} cancelled)",
                job_id=self.job_id,
                waited_for=needs,
            )
        logger.info("job %s: no live worker can run it; running it on this host", self.job_id)
        self.local = local
        local.start()


def _claimable_soon(job: JobRecord) -> bool:
    """A job a one-shot worker could claim now or later: queued, or running under a lease that is
    no live worker's (it may be a dead one's; the one-shot worker claims it when that lease expires)."""
    return job.status in (JobStatus.QUEUED, JobStatus.RUNNING)


def _task(job: JobRecord) -> str:
    if job.kind == "test_load":
        return f"load engine {job.payload.get('engine_id')}"
    return f"run {job.kind} job {job.id}"


def warm_modules(job: JobRecord) -> list[str]:
    """What a child running `job` imports beyond what this process has: its backend's library."""
    backend = BACKENDS.get(str(job.requirements.get("backend")))
    if backend is None or importlib.util.find_spec(backend.module) is None:
        return []
    return [backend.module]


class _LocalWorker:
    """A one-shot worker for one job, in a thread of this process; its attempts run in children of a
    zygote (see the module docstring)."""

    def __init__(self, app: AppContext, job: JobRecord) -> None:
        self.app = app
        self.job = job
        self.job_id = job.id or 0
        self.host = host_fingerprint()
        self.capabilities = worker_capabilities(self.host)
        self.config = WorkerConfig(
            name=f"oneshot-{default_worker_name()}", job_id=self.job_id, lease_seconds=lease_seconds_from_env()
        )
        self.worker: Worker | None = None
        self.zygote: Zygote | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"enginecache-oneshot-job-{self.job_id}", daemon=True)
        self._stopped = False

    def _run(self) -> None:
        assert self.worker is not None
        try:
            self.worker.run()
        except Exception as err:  # kept for check(): the wait ends with it instead of running on
            self.error = err
            logger.exception("one-shot worker %s failed", self.config.name)

    def start(self) -> None:
        if fork_hazard() is None:  # a fork is safe only now: no other thread holds a lock
            # No database connection crosses the fork (SQLite forbids using one there, and a copy of
            # one would share this process's lock bookkeeping): the pool reconnects on next use.
            self.app.catalog.dispose()
            self.zygote = Zygote(warm=warm_modules(self.job))
        self.worker = Worker(self.app, self.config, host=self.host, children=self.zygote)
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
            waited_for=f"this host's worker {self.config.name}",
        )

    def stop(self, *, hand_back: bool) -> None:
        """Let the worker end (it does by itself once its job is terminal), or with `hand_back`
        kill the attempt it runs and return the job to the queue; then end the zygote."""
        if self._stopped:
            return
        self._stopped = True
        if self.worker is not None and self._thread.is_alive():
            if hand_back:
                self.worker.request_stop(hard=True)
            self._thread.join(LOCAL_WORKER_STOP_SECONDS)
            if self._thread.is_alive():
                logger.warning("one-shot worker %s did not stop in %g s", self.config.name, LOCAL_WORKER_STOP_SECONDS)
        if self.zygote is not None:
            self.zygote.close()
