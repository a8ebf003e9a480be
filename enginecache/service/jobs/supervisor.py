"""One job attempt, seen through by the worker that claimed it: the child process it runs in, the
lease's heartbeat, cancel and hard stop, the attempt's deadline, and the outcome recorded.

An attempt's timeout counts from its claim (the lease's `started_at`) and is enforced by a timer
thread that kills the child when it runs out (`AttemptDeadline`): the supervising thread may be
waiting on the catalog at that moment (SQLite's busy timeout), and the child must not outlive its
deadline meanwhile, let alone finish and record a result past it. An engine row the attempt left
PENDING when its child ended was never published: it is marked FAILED with the reason.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import threading
import time
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, Protocol

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.fingerprint import HostFingerprint
from enginecache.db import engines, queue
from enginecache.db.models import TERMINAL_JOB_STATUSES, EngineRecord, EngineStatus, JobRecord, JobStatus
from enginecache.db.queue import Clock
from enginecache.db.sqlexec import AlchemyExecutor
from enginecache.errors import StaleLeaseError
from enginecache.service.context import AppContext
from enginecache.service.jobs.child import CHILD_ERROR_FILE, EXIT_LEASE_LOST, run_child
from enginecache.service.jobs.kinds import EXIT_RECORDED, ChildSpec
from enginecache.service.jobs.staging import remove_staging, staging_dir

logger = logging.getLogger("enginecache.service.jobs.worker")  # the worker's log: its lines keep their logger name

CANCEL_POLL_SECONDS = 0.5


class AttemptSettings(Protocol):
    """What supervising an attempt reads of its worker's configuration (`service.jobs.worker.WorkerConfig`)."""

    @property
    def lease_seconds(self) -> float: ...

    @property
    def heartbeat_seconds(self) -> float: ...

    @property
    def backoff_base_seconds(self) -> float: ...

    @property
    def backoff_max_seconds(self) -> float: ...

    @property
    def job_kinds(self) -> tuple[str, ...]: ...


def _kill_group(pid: int) -> None:
    """SIGKILL a child's process group (it and whatever it started), or the child alone where it
    has no group of its own yet (it calls setsid first thing) or the group is not all ours."""
    try:
        os.killpg(pid, signal.SIGKILL)
        return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


class AttemptDeadline:
    """Kills an attempt's child when the attempt's time is up, from a timer thread of its own."""

    def __init__(self, pid: int, seconds_left: float) -> None:
        self.expired = threading.Event()
        self._pid = pid
        self._timer = threading.Timer(max(0.0, seconds_left), self._expire)
        self._timer.daemon = True

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def _expire(self) -> None:
        self.expired.set()  # before the kill: whoever sees the child gone sees why
        _kill_group(self._pid)


@dataclass(eq=False)
class AttemptSupervisor:
    """Runs each attempt a worker claims in a child process and sees it to its end (`run`).

    `children` starts each attempt's child process (a multiprocessing context, or anything with
    its `Process(target, args, name)`); `hard_stop` set: hand the running job back to the queue."""

    app: AppContext
    settings: AttemptSettings
    _: KW_ONLY
    host: HostFingerprint
    clock: Clock
    children: Any
    hard_stop: threading.Event

    def run(self, lease: queue.Lease) -> None:
        job = lease.job
        job_id = job.id or 0
        work_dir = self.app.store.tmp_dir / f"job-{job_id}-{job.attempts}-{os.getpid()}"
        work_dir.mkdir(parents=True, exist_ok=True)
        spec = ChildSpec(
            home=self.app.home,
            db_url=self.app.db_url,
            work_dir=work_dir,
            job_id=job_id,
            token=lease.token,
            attempt=job.attempts,
            kind=job.kind,
            payload=job.payload,
            host=self.host,
            job_key=job.idempotency_key if job.kind == "build" else None,
            job_kinds=self.settings.job_kinds,
            worker_pid=os.getpid(),
            staging_dir=staging_dir(self.app.store.tmp_dir, job_id),
        )
        process = self.children.Process(target=run_child, args=(spec,), name=f"job-{job_id}")
        process.start()
        deadline = AttemptDeadline(process.pid, self._seconds_left(job))
        deadline.start()
        logger.info("job %s attempt %s: child %s started", job_id, job.attempts, process.pid)
        outcome: str | None = None
        try:
            try:  # a write that may wait on the catalog's lock: the deadline runs on meanwhile
                queue.set_runner(self.app.catalog, job_id, lease.token, process.pid, clock=self.clock)
            except (StaleLeaseError, sa.exc.OperationalError) as err:
                logger.warning("job %s: child pid not recorded: %s", job_id, err)
            next_beat = time.monotonic() + self.settings.heartbeat_seconds
            while True:
                process.join(min(CANCEL_POLL_SECONDS, self.settings.heartbeat_seconds))
                if process.exitcode is not None:
                    break
                outcome = self._check_running(job, lease.token, next_beat)
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.settings.heartbeat_seconds
                if outcome is not None:
                    self._kill(process)
                    break
            if (
                deadline.expired.is_set()
                and outcome is None
                and process.exitcode not in (EXIT_RECORDED, EXIT_LEASE_LOST)
            ):
                outcome = f"timed out after {job.timeout_seconds:g} s"
            self._record_outcome(lease, process.exitcode, outcome, child_error(work_dir))
        finally:
            deadline.cancel()
            if process.exitcode is None:  # supervision itself failed: never leave the child behind
                self._kill(process)
            shutil.rmtree(work_dir, ignore_errors=True)
            self._abandon_pending_engines(job_id, job.attempts, outcome or _describe_exit(process.exitcode))
            self._drop_staging_once_ended(job_id, spec.staging_dir)

    def _drop_staging_once_ended(self, job_id: int, folder: Path | None) -> None:
        """The job's staging folder goes with the job: removed here once the job is terminal (this
        attempt ended it, or someone did meanwhile); kept while another attempt may use it. A catalog
        that cannot be read, or a folder that cannot be removed, leaves it to `enginecache gc`."""
        if folder is None or not folder.exists():
            return
        try:
            ended = queue.get_job(self.app.catalog, job_id).status in TERMINAL_JOB_STATUSES
        except sa.exc.OperationalError as err:
            logger.warning("job %s: staging folder %s left to gc: %s", job_id, folder, err.orig)
            return
        if ended:
            try:
                remove_staging(folder)
            except OSError as err:
                logger.warning("job %s: staging folder %s left to gc: %s", job_id, folder, err)

    def _seconds_left(self, job: JobRecord) -> float:
        """What remains of the attempt's timeout, counted from its claim (the lease's start)."""
        started = job.started_at or self.clock()
        return job.timeout_seconds - max(0.0, (self.clock() - started).total_seconds())

    def _check_running(self, job: JobRecord, token: str, next_beat: float) -> str | None:
        """Why to stop the child now, if at all: cancel, lost lease, hard stop (the timeout is
        `AttemptDeadline`'s)."""
        job_id = job.id or 0
        try:
            if time.monotonic() >= next_beat:
                cancel = queue.heartbeat(self.app.catalog, job_id, token, self.settings.lease_seconds, clock=self.clock)
            else:
                cancel = queue.get_job(self.app.catalog, job_id).cancel_requested
        except StaleLeaseError as err:
            logger.warning("job %s: %s; stopping our child", job_id, err)
            return "lease lost"
        except sa.exc.OperationalError as err:  # catalog busy: the lease is checked again next beat
            logger.warning("job %s: heartbeat not recorded: %s", job_id, err.orig)
            cancel = False
        if cancel:
            return "cancelled"
        if self.hard_stop.is_set():
            return "handed back"
        return None

    def _kill(self, process: Any) -> None:
        _kill_group(process.pid)
        process.join()

    def _record_outcome(
        self, lease: queue.Lease, exitcode: int | None, outcome: str | None, detail: str | None = None
    ) -> None:
        job_id = lease.job.id or 0
        try:
            if outcome == "cancelled":
                queue.complete(
                    self.app.catalog,
                    job_id,
                    lease.token,
                    status=JobStatus.CANCELLED,
                    error="cancelled while running",
                    clock=self.clock,
                )
            elif outcome == "handed back":
                queue.release(self.app.catalog, job_id, lease.token, clock=self.clock)
            elif outcome == "lease lost" or exitcode in (EXIT_RECORDED, EXIT_LEASE_LOST):
                return
            else:
                error = outcome or _describe_exit(exitcode) + (f": {detail}" if detail else "")
                backoff = min(self.settings.backoff_max_seconds, self.settings.backoff_base_seconds**lease.job.attempts)
                job = queue.fail_attempt(
                    self.app.catalog, job_id, lease.token, error=error, backoff_seconds=backoff, clock=self.clock
                )
                logger.warning("job %s attempt %s failed (%s): now %s", job_id, lease.job.attempts, error, job.status)
        except (StaleLeaseError, sa.exc.OperationalError) as err:
            logger.warning("job %s: outcome not recorded, %s", job_id, err)

    def _abandon_pending_engines(self, job_id: int, attempt: int, reason: str) -> None:
        """An attempt's engine row still PENDING after its child ended was never published."""
        try:
            self._fail_pending_engines(job_id, attempt, reason)
        except sa.exc.OperationalError as err:
            logger.warning("job %s: unpublished engine rows of attempt %s not marked: %s", job_id, attempt, err.orig)

    def _fail_pending_engines(self, job_id: int, attempt: int, reason: str) -> None:
        error = f"attempt {attempt} of job {job_id} ended without publishing: {reason}"
        with self.app.catalog.write() as session:
            engine_ids = session.exec(
                select(EngineRecord.id).where(
                    EngineRecord.job_id == job_id,
                    EngineRecord.job_attempt == attempt,
                    col(EngineRecord.status) == EngineStatus.PENDING,
                )
            ).all()
            ex = AlchemyExecutor(session.connection())
            for engine_id in engine_ids:
                engines.mark_failed(ex, engine_id or 0, error, at=self.clock(), only_pending=True)


CHILD_ERROR_CHARS = 1000


def child_error(work_dir: Path) -> str | None:
    """The last line of the traceback a child left in its working directory, if any, at most
    CHILD_ERROR_CHARS long (an error of the tree is one line: what failed, the key, the server's answer)."""
    path = work_dir / CHILD_ERROR_FILE
    if not path.is_file():
        return None
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:CHILD_ERROR_CHARS] if lines else None


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "child did not exit"
    if exitcode < 0:
        try:
            return f"child killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"child killed by signal {-exitcode}"
    return f"child exited with status {exitcode}"
