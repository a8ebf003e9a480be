"""The worker: registers its host and capabilities, claims jobs it can run, and supervises one
child process per job attempt (lease heartbeat, cancel, timeout, crash recovery).

Signal handlers only set flags. First SIGINT/SIGTERM: claim nothing new, finish the running
jobs, exit. Second: kill the children, hand their jobs back to the queue, exit.
"""

from __future__ import annotations

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
from enginecache.errors import StaleLeaseError
from enginecache.service.context import AppContext
from enginecache.service.jobchild import CHILD_ERROR_FILE, EXIT_LEASE_LOST, EXIT_RECORDED, ChildSpec, run_child
from enginecache.service.routing import can_run, worker_capabilities

logger = logging.getLogger(__name__)

# Modules the fork server imports once, so each job's child starts warm (no GPU context is
# created by importing them; CUDA initializes in the child when a build needs it).
CANCEL_POLL_SECONDS = 0.5
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


class Worker:
    def __init__(self, app: AppContext, config: WorkerConfig, *, host: HostFingerprint | None = None) -> None:
        self.app = app
        self.config = config
        self.host = host or host_fingerprint()
        self.capabilities = worker_capabilities(self.host)
        self._stop = threading.Event()
        self._hard_stop = threading.Event()
        self._context = _child_context()
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
        )
        beat = threading.Thread(target=self._heartbeat_loop, name="worker-heartbeat", daemon=True)
        beat.start()
        slots = [
            threading.Thread(target=self._slot_loop, args=(i,), name=f"slot-{i}")
            for i in range(self.config.concurrency)
        ]
        for slot in slots:
            slot.start()
        for slot in slots:
            slot.join()
        self._stop.set()
        beat.join(timeout=self.config.heartbeat_seconds + 1)
        queue.worker_heartbeat(self.app.catalog, self.config.name, current_job_id=None, status="offline")
        return self.jobs_run

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.config.heartbeat_seconds):
            with self._lock:
                current = next(iter(self._current.values()), None)
            try:
                queue.worker_heartbeat(self.app.catalog, self.config.name, current_job_id=current)
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
        )
        process = self._context.Process(target=run_child, args=(spec,), name=f"job-{job_id}")
        process.start()
        logger.info("job %s attempt %s: child %s started", job_id, job.attempts, process.pid)
        try:
            queue.set_runner(self.app.catalog, job_id, lease.token, process.pid)
        except (StaleLeaseError, sa.exc.OperationalError) as err:
            logger.warning("job %s: child pid not recorded: %s", job_id, err)
        deadline = time.monotonic() + job.timeout_seconds
        outcome: str | None = None
        try:
            next_beat = time.monotonic() + self.config.heartbeat_seconds
            while True:
                process.join(min(CANCEL_POLL_SECONDS, self.config.heartbeat_seconds))
                if process.exitcode is not None:
                    break
                outcome = self._check_running(job, lease.token, deadline, next_beat)
                if time.monotonic() >= next_beat:
                    next_beat = time.monotonic() + self.config.heartbeat_seconds
                if outcome is not None:
                    self._kill(process)
                    break
            self._record_outcome(lease, process.exitcode, outcome, child_error(work_dir))
        finally:
            if process.exitcode is None:  # supervision itself failed: never leave the child behind
                self._kill(process)
            shutil.rmtree(work_dir, ignore_errors=True)
            self._abandon_pending_engines(job_id, job.attempts, outcome or _describe_exit(process.exitcode))

    def _check_running(self, job: JobRecord, token: str, deadline: float, next_beat: float) -> str | None:
        """Why to stop the child now, if at all: cancel, lost lease, timeout, hard stop."""
        job_id = job.id or 0
        try:
            if time.monotonic() >= next_beat:
                cancel = queue.heartbeat(self.app.catalog, job_id, token, self.config.lease_seconds)
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
        if time.monotonic() > deadline:
            return f"timed out after {job.timeout_seconds:g} s"
        if self._hard_stop.is_set():
            return "handed back"
        return None

    def _kill(self, process: Any) -> None:
        pid = process.pid
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        except PermissionError:
            process.kill()
        process.join()

    def _record_outcome(
        self, lease: queue.Lease, exitcode: int | None, outcome: str | None, detail: str | None = None
    ) -> None:
        job_id = lease.job.id or 0
        try:
            if outcome == "cancelled":
                queue.complete(
                    self.app.catalog, job_id, lease.token, status=JobStatus.CANCELLED, error="cancelled while running"
                )
            elif outcome == "handed back":
                queue.release(self.app.catalog, job_id, lease.token)
            elif outcome == "lease lost" or exitcode in (EXIT_RECORDED, EXIT_LEASE_LOST):
                return
            else:
                error = outcome or _describe_exit(exitcode) + (f": {detail}" if detail else "")
                backoff = min(self.config.backoff_max_seconds, self.config.backoff_base_seconds**lease.job.attempts)
                job = queue.fail_attempt(self.app.catalog, job_id, lease.token, error=error, backoff_seconds=backoff)
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
                row.finished_at = utcnow()
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
