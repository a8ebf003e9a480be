"""The worker: registers its host and capabilities, claims jobs it can run, and supervises one
child process per job attempt (lease heartbeat, cancel, timeout, crash recovery).

Signal handlers only set flags. First SIGINT/SIGTERM: claim nothing new, finish the running
jobs (the worker's row says "stopping" meanwhile, and it keeps beating), exit. Second: kill the
children, hand their jobs back to the queue, exit.

This module is the worker's lifecycle and its claim loop (one thread per slot); what happens to an
attempt once claimed (its child, heartbeat, deadline and outcome) is `service.jobs.supervisor`.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.processes import fork_hazard
from enginecache.db import queue
from enginecache.db.models import TERMINAL_JOB_STATUSES, utcnow
from enginecache.db.queue import Clock
from enginecache.errors import BuildOptionError
from enginecache.service.context import AppContext
from enginecache.service.jobs.kinds import job_kinds_from_env, load_job_kinds
from enginecache.service.jobs.routing import SCOPE_JOB, SCOPE_QUEUE, can_run, warm_libraries, worker_capabilities
from enginecache.service.jobs.supervisor import AttemptDeadline, AttemptSupervisor, child_error
from enginecache.service.jobs.zygote import Zygote

logger = logging.getLogger(__name__)

__all__ = [
    "AttemptDeadline",
    "Worker",
    "WorkerConfig",
    "child_error",
    "default_worker_name",
    "run_worker",
]

STOP_POLL_SECONDS = 0.1  # how soon the worker's row says "stopping" after a stop request
SIGNAL_POLL_SECONDS = 0.2  # how soon the main thread runs a signal handler another thread received
OFFLINE_ATTEMPTS = 5  # tries to record "offline" as the worker ends
# Modules the worker's zygote imports once, so each job's child starts warm (no GPU context is
# created by importing them; CUDA initializes in the child when a build needs it); the backends'
# libraries are those their declarations mark warm.
WARM_MODULES = ("enginecache.service.jobs.child", "onnx", *warm_libraries(), "onnxconverter_common")


LEASE_SECONDS_ENV = "ENGINECACHE_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 30.0


def lease_seconds_from_env() -> float:
    """A job lease's length: $ENGINECACHE_LEASE_SECONDS (how long a job whose worker died waits
    before another worker may take it over; heartbeats every third of it), else 30 s."""
    raw = os.environ.get(LEASE_SECONDS_ENV, "").strip()
    if not raw:
        return DEFAULT_LEASE_SECONDS
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not 1.0 <= value <= 86_400.0:
        raise BuildOptionError(f"{LEASE_SECONDS_ENV}={raw!r}: give seconds between 1 and 86400")
    return value


@dataclass(frozen=True)
class WorkerConfig:
    name: str
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    poll_seconds: float = 0.2
    concurrency: int = 1
    once: bool = False  # run until nothing is claimable, then exit
    job_id: int | None = None  # claim only this job (the CLI's one-shot local worker)
    backoff_base_seconds: float = 2.0
    backoff_max_seconds: float = 60.0
    # Job kinds beyond the product's: "module:attribute" entries (`service.jobs.kinds`), by default
    # those of $ENGINECACHE_JOB_KINDS.
    job_kinds: tuple[str, ...] = field(default_factory=job_kinds_from_env)

    @property
    def heartbeat_seconds(self) -> float:
        return max(0.05, self.lease_seconds / 3)


def default_worker_name() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


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
        """`children` starts each attempt's child process (a `service.jobs.zygote.Zygote`, a
        multiprocessing context, or anything with its `Process(target, args, name)`); by default the
        worker makes a zygote of its own as it starts (`run`).
        BuildOptionError where `config.job_kinds` names no job kinds (checked here, before any claim)."""
        load_job_kinds(config.job_kinds)
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
        self._own_children = children is None  # a given `children` is the caller's to make and end
        self._attempts = AttemptSupervisor(
            app, config, host=self.host, clock=clock, children=children, hard_stop=self._hard_stop
        )
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
        zygote = self._make_children() if self._own_children else None
        try:
            return self._claim_and_run()
        finally:
            if zygote is not None:
                zygote.close()

    def _make_children(self) -> Zygote | None:
        """What starts this worker's attempts: a zygote made now, while this process has one thread
        (a fork is safe only then), and warm (`WARM_MODULES`) before the first claim, not inside the
        first attempt, whose lease would run out meanwhile with no heartbeat. Where other threads run,
        each attempt is a fresh interpreter instead (multiprocessing's spawn: seconds per attempt)."""
        hazard = fork_hazard()
        if hazard is not None:
            logger.info("worker %s: %s; each attempt starts a fresh interpreter", self.config.name, hazard)
            self._attempts.children = multiprocessing.get_context("spawn")
            return None
        self.app.catalog.dispose()  # no open connection may cross the fork
        zygote = Zygote(warm=WARM_MODULES)
        try:
            zygote.wait_ready()
        except BaseException:
            zygote.close()
            raise
        self._attempts.children = zygote
        return zygote

    def _claim_and_run(self) -> int:
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
                # Never an untimed join: a SIGTERM the kernel hands to another thread (it may, after
                # the process was stopped and continued) runs its Python handler only when the
                # main thread next runs bytecode, which a join without a timeout never lets it do.
                while slot.is_alive():
                    slot.join(SIGNAL_POLL_SECONDS)
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
                self._attempts.run(lease)
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


def run_worker(app: AppContext, config: WorkerConfig, *, install_signals: bool = True) -> int:
    """Run a worker until it stops (the `enginecache worker` command); an audit log whose append-only
    triggers are missing or disabled is logged as an error first (`report_trigger_problems`)."""
    from enginecache.service.access.auditverify import report_trigger_problems

    report_trigger_problems(app)
    worker = Worker(app, config)
    if install_signals and threading.current_thread() is threading.main_thread():
        worker.install_signal_handlers()
    return worker.run()
