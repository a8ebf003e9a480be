"""The worker: registers its host and capabilities, claims jobs it can run, and supervises one
child process per job attempt (lease heartbeat, cancel, timeout, crash recovery).

Signal handlers only set flags. First SIGINT/SIGTERM: claim nothing new, finish the running
jobs (the worker's row says "stopping" meanwhile, and it keeps beating), exit. Second: kill the
children, hand their jobs back to the queue, exit.

An attempt's timeout counts from its claim (the lease's `started_at`) and is enforced by a timer
thread that kills the child when it runs out: the supervising thread may be waiting on the
catalog at that moment (SQLite's busy timeout), and the child must not outlive its deadline
meanwhile, let alone finish and record a result past it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.db import queue
from enginecache.db.models import TERMINAL_JOB_STATUSES, EngineRecord, EngineStatus, JobRecord, JobStatus, utcnow
from enginecache.db.queue import Clock
from enginecache.errors import StaleLeaseError
from enginecache.service.context import AppContext
from enginecache.service.jobattempt import CHILD_ERROR_FILE, EXIT_LEASE_LOST, EXIT_RECORDED, ChildSpec
from enginecache.service.jobchild import run_child
from enginecache.service.jobkinds import test_kinds_enabled
from enginecache.service.routing import SCOPE_JOB, SCOPE_QUEUE, can_run, worker_capabilities

logger = logging.getLogger(__name__)

# Modules the fork server imports once, so each job's child starts warm (no GPU context is
# created by importing them; CUDA initializes in the child when a build needs it).
CANCEL_POLL_SECONDS = 0.5
STOP_POLL_SECONDS = 0.1  # how soon the worker's row says "stopping" after a stop request
OFFLINE_ATTEMPTS = 5  # tries to record "offline" as the worker ends
WARM_MODULES = ("enginecache.service.jobchild", "onnx", "onnxruntime", "tensorrt_rtx", "onnxconverter_common")


@dataclass(frozen=True)
class WorkerConfig:
    name: str
    lease_seconds: float = 30.0
    poll_seconds: float = 0.2
    concurrency: int = 1
    once: bool = False  # run until nothing is claimable, then exit
    job_id: int | None = None  # claim only this job (the CLI's one-shot local worker)
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 60.0

    @property
    def heartbeat_seconds(self) -> float:
        return max(0.05, self.lease_seconds / 3)


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _child_context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([m for m in WARM_MODULES if importlib.util.find_spec(m) is not None])
        return context
    return multiprocessing.get_context("spawn")


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


class Worker:
    def __init__(
        self,
        app: AppContext,
        config: WorkerConfig,
        *,
        host: HostFingerprint | None = None,
        clock: Clock = utcnow,
        children: Any = None,
    ) -> None:
        """`children` starts each attempt's child process (a multiprocessing context, or anything with
        its `Process(target, args, name)`); default: the warm fork server (`WARM_MODULES`)."""
        self.app = app
        self.config = config
        self.clock = clock  # the queue's clock: leases, the attempt's start, backoff
        self.host = host or host_fingerprint()
        # A one-shot worker (`job_id`) says so: it is no worker for any other job (routing.takes_queued_jobs).
        scope = {"scope": SCOPE_QUEUE} if config.job_id is None else {"scope": SCOPE_JOB, "job_id": config.job_id}
        self.capabilities = {**worker_capabilities(self.host), **scope}
        self._stop = threading.Event()
        self._hard_stop = threading.Event()
        self._slots_done = threading.Event()
        self._context = children if children is not None else _child_context()
        self._current: dict[int, int] = {}  # slot -> job id
        self._lock = threading.Lock()
        self.jobs_run = 0

    # -- lifecycle ----------------------------------------------------------------------

    def request_stop(self, *, hard: bool = False) -> None:
        if self._stop.is_set() or hard:
            self._hard_stop.set()
        self._stop.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, _frame: Any) -> None:
            self.request_stop()

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)

    def run(self) -> int:
        """Claim and run jobs until stopped (or, with `once`/`job_id`, until none is claimable)."""
        queue.register_worker(
            self.app.catalog,
            name=self.config.name,
            hostname=self.host.hostname,
            pid=os.getpid(),
            fingerprint=self.host.to_dict(),
            capabilities=self.capabilities,
            clock=self.clock,
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="worker-heartbeat", daemon=True)
        try:
            beat.start()
            slots = [
                threading.Thread(target=self._slot_loop, args=(i,), name=f"slot-{i}")
                for i in range(self.config.concurrency)
            ]
            for slot in slots:
                slot.start()
            for slot in slots:
                slot.join()
        finally:  # the row's lease ends with the worker, however it ends
            self._stop.set()
            self._slots_done.set()
            if beat.is_alive():
                beat.join(timeout=self.config.heartbeat_seconds + 1)
            self._mark_offline()
        return self.jobs_run

    def _mark_offline(self) -> None:
        """Record that this worker has ended (retried while the catalog is busy; if it never gets
        through, the row's heartbeat lease runs out by itself)."""
        for attempt in range(OFFLINE_ATTEMPTS):
            try:
                queue.worker_heartbeat(
                    self.app.catalog, self.config.name, current_job_id=None, status="offline", clock=self.clock
                )
                return
            except sa.exc.OperationalError as err:
                logger.warning("worker %s: offline not recorded (try %d): %s", self.config.name, attempt + 1, err.orig)
                time.sleep(self.config.poll_seconds)

    def _heartbeat_loop(self) -> None:
        """Beat every `heartbeat_seconds` until the slots are done, and at once when a stop is
        requested: a stopping worker is still alive (it finishes its jobs) but claims nothing."""
        next_beat = time.monotonic() + self.config.heartbeat_seconds
        stopping_recorded = False
        while not self._slots_done.wait(STOP_POLL_SECONDS):
            stopping = self._stop.is_set()
            if time.monotonic() < next_beat and stopping == stopping_recorded:
                continue
            next_beat = time.monotonic() + self.config.heartbeat_seconds
            with self._lock:
                current = next(iter(self._current.values()), None)
            try:
                queue.worker_heartbeat(
                    self.app.catalog,
                    self.config.name,
                    current_job_id=current,
                    status="stopping" if stopping else "online",
                    clock=self.clock,
                )
                stopping_recorded = stopping
            except sa.exc.OperationalError as err:  # catalog busy or unreachable: beat again next time
                logger.warning("worker heartbeat not recorded: %s", err.orig)

    def _slot_loop(self, slot: int) -> None:
        while not self._stop.is_set():
            try:
                lease = queue.claim(
                    self.app.catalog,
                    worker=self.config.name,
                    can_run=lambda requirements: can_run(requirements, self.capabilities),
                    lease_seconds=self.config.lease_seconds,
                    job_id=self.config.job_id,
                    clock=self.clock,
                )
            except sa.exc.OperationalError as err:  # catalog busy (SQLite lock) or unreachable: retry
                logger.warning("claim failed, retrying: %s", err.orig)
                self._stop.wait(self.config.poll_seconds)
                continue
            if lease is None:
                if self._done_waiting():
                    return
                self._stop.wait(self.config.poll_seconds)
                continue
            with self._lock:
                self._current[slot] = lease.job.id or 0
            try:
                self._supervise(lease)
            except sa.exc.OperationalError as err:  # the lease runs out and the job is taken over
                logger.error("job %s: catalog unreachable while supervising: %s", lease.job.id, err.orig)
            finally:
                with self._lock:
                    self._current.pop(slot, None)
                self.jobs_run += 1
            if self.config.job_id is not None and self._done_waiting():
                return

    def _done_waiting(self) -> bool:
        """With nothing to claim: `once` stops; a one-shot worker for one job stops once that job
        is finished (it waits through backoff and retries, or while another worker holds it)."""
        if self.config.job_id is not None:
            return queue.get_job(self.app.catalog, self.config.job_id).status in TERMINAL_JOB_STATUSES
        return self.config.once

    # -- one attempt ----------------------------------------------------------------------

    def _supervise(self, lease: queue.Lease) -> None:
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
            test_kinds=test_kinds_enabled(),
        )
        process = self._context.Process(target=run_child, args=(spec,), name=f"job-{job_id}")
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
            next_beat = time.monotonic() + self.config.heartbeat_seconds
            while True:
                process.join(min(CANCEL_POLL_SECONDS, self.config.heartbeat_seconds))
                if process.exitcode is not None:
                    break
                outcome = self._check_running(job, lease.token, next_beat)
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.config.heartbeat_seconds
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
                cancel = queue.heartbeat(self.app.catalog, job_id, token, self.config.lease_seconds, clock=self.clock)
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
        if self._hard_stop.is_set():
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
                backoff = min(self.config.backoff_max_seconds, self.config.backoff_base_seconds**lease.job.attempts)
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
        with self.app.catalog.write() as session:
            rows = session.exec(
                select(EngineRecord).where(
                    EngineRecord.job_id == job_id,
                    EngineRecord.job_attempt == attempt,
                    col(EngineRecord.status) == EngineStatus.PENDING,
                )
            ).all()
            for row in rows:
                row.status = EngineStatus.FAILED
                row.error = f"attempt {attempt} of job {job_id} ended without publishing: {reason}"
                row.finished_at = self.clock()
                session.add(row)


def child_error(work_dir: Path) -> str | None:
    """The last line of the traceback a child left in its working directory, if any."""
    path = work_dir / CHILD_ERROR_FILE
    if not path.is_file():
        return None
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:500] if lines else None


def _describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "child did not exit"
    if exitcode < 0:
        try:
            return f"child killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"child killed by signal {-exitcode}"
    return f"child exited with status {exitcode}"


def run_worker(app: AppContext, config: WorkerConfig, *, install_signals: bool = True) -> int:
    worker = Worker(app, config)
    if install_signals and threading.current_thread() is threading.main_thread():
        worker.install_signal_handlers()
    return worker.run()
