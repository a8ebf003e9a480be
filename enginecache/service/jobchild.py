"""The child process that runs one job attempt: isolated, in its own process group and
working directory, writing progress and its result under the job's lease token."""

from __future__ import annotations

import collections
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session

from enginecache.core.backends.base import ProgressEvent
from enginecache.core.fingerprint import HostFingerprint
from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import BuildFailedError, EngineCacheError, StaleLeaseError
from enginecache.service.builds import BuildResult, find_ready_engine, plan_build, run_build
from enginecache.service.context import AppContext
from enginecache.service.jobs import request_from_payload
from enginecache.service.testload import run_test_load_job as _run_test_load

logger = logging.getLogger(__name__)

EXIT_RECORDED = 0  # the child wrote the job's terminal state
EXIT_TRANSIENT = 3  # an unexpected error: the parent counts the attempt and retries
EXIT_LEASE_LOST = 4  # the lease was taken over: nothing of ours was written
CHILD_ERROR_FILE = "child-error.txt"  # an unexpected error's traceback, for the parent to record
PROGRESS_INTERVAL_SECONDS = 0.5
LOG_TAIL_LINES = 30


@dataclass(frozen=True)
class ChildSpec:
    home: Path
    db_url: str
    work_dir: Path
    job_id: int
    token: str
    attempt: int
    kind: str
    payload: dict[str, Any]
    host: HostFingerprint
    job_key: str | None = None  # the cache key the job was submitted under

    def finish(
        self,
        app: AppContext,
        status: str,
        *,
        error: str | None = None,
        result_engine_id: int | None = None,
        on_commit: Callable[[Session], None] | None = None,
    ) -> None:
        """Record this attempt's outcome under its lease (StaleLeaseError once the lease is lost)."""
        queue.complete(
            app.catalog,
            self.job_id,
            self.token,
            status=status,
            error=error,
            result_engine_id=result_engine_id,
            on_commit=on_commit,
        )


class ProgressWriter:
    """Turns TensorRT phases and log lines into job-row updates, at most every 0.5 s."""

    def __init__(self, app: AppContext, spec: ChildSpec) -> None:
        self._app = app
        self._spec = spec
        self._lines: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._top_phase: str | None = None
        self._phase: str | None = None
        self._top_steps = 0
        self._top_done = 0
        self._last_write = 0.0

    def on_progress(self, event: ProgressEvent) -> None:
        """Progress is the share of the outermost phase's steps done; the phase shown is the newest."""
        if event.kind == "start" and event.parent is None:
            self._top_phase, self._top_steps, self._top_done = event.phase, event.steps or 0, 0
        elif event.kind == "step" and event.phase == self._top_phase:
            self._top_done = (event.step or 0) + 1
        elif event.kind == "finish" and event.phase == self._top_phase:
            self._top_done = self._top_steps
        if event.kind == "start":
            self._phase = event.phase if event.parent is None else f"{self._top_phase}: {event.phase}"
            self._lines.append(f"[phase] {event.phase}" + (f" ({event.steps} steps)" if event.steps else ""))
        self.flush()

    def on_log(self, line: str) -> None:
        self._lines.append(line)
        self.flush()

    def fraction(self) -> float | None:
        return min(0.99, self._top_done / self._top_steps) if self._top_steps else None

    def flush(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_write < PROGRESS_INTERVAL_SECONDS:
            return
        self._last_write = now
        queue.report_progress(
            self._app.catalog,
            self._spec.job_id,
            self._spec.token,
            progress=self.fraction(),
            phase=self._phase,
            log_tail="\n".join(self._lines),
        )


def _die_with_parent() -> None:
    """On Linux, get SIGKILL when the fork server that made us exits (it exits with its worker), so
    a worker killed outright (SIGKILL, OOM) leaves no build running on its own."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %s", ctypes.get_errno())


def run_child(spec: ChildSpec) -> None:
    """Entry point of the child process (multiprocessing target); exits with a code above."""
    os.setsid()  # own process group: cancel and timeout kill the whole group
    _die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides; a terminal ^C must not reach us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(spec.work_dir)
    app = AppContext(home=spec.home, db_url=spec.db_url, tmp_dir=spec.work_dir)
    try:
        code = _run(app, spec)
    except StaleLeaseError as err:
        logger.warning("job %s attempt %s: %s", spec.job_id, spec.attempt, err)
        code = EXIT_LEASE_LOST
    except Exception:
        logger.exception("job %s attempt %s failed", spec.job_id, spec.attempt)
        (spec.work_dir / CHILD_ERROR_FILE).write_text(traceback.format_exc())
        code = EXIT_TRANSIENT
    finally:
        app.close()
    os._exit(code)


def _run(app: AppContext, spec: ChildSpec) -> int:
    runner = JOB_RUNNERS.get(spec.kind)
    if runner is None:
        error = f"unknown job kind {spec.kind!r}"
        spec.finish(app, JobStatus.FAILED, error=error)
        return EXIT_RECORDED
    return runner(app, spec)


def _run_build(app: AppContext, spec: ChildSpec) -> int:
    request = request_from_payload(spec.payload)
    try:
        plan = plan_build(app, request, host=spec.host)
    except EngineCacheError as err:
        spec.finish(app, JobStatus.FAILED, error=str(err))
        return EXIT_RECORDED
    if spec.job_key is not None and plan.cache_key != spec.job_key:
        error = (
            f"this worker plans cache key {plan.cache_key[:16]}, the job was submitted for {spec.job_key[:16]}: "
            "its host differs in a key ingredient (backend version, OS, target); route the job elsewhere"
        )
        spec.finish(app, JobStatus.FAILED, error=error)
        return EXIT_RECORDED
    existing = find_ready_engine(app, plan.cache_key)
    if existing is not None:
        spec.finish(app, JobStatus.SUCCEEDED, result_engine_id=existing.id)
        return EXIT_RECORDED
    writer = ProgressWriter(app, spec)

    def finalize(engine_id: int, mutate: Callable[[Session], None]) -> None:
        writer.flush(force=True)
        spec.finish(app, JobStatus.SUCCEEDED, result_engine_id=engine_id, on_commit=mutate)

    try:
        result: BuildResult = run_build(
            app,
            plan,
            progress=writer.on_progress,
            log=writer.on_log,
            job_id=spec.job_id,
            job_attempt=spec.attempt,
            finalize=finalize,
        )
    except BuildFailedError as err:
        writer.flush(force=True)
        spec.finish(app, JobStatus.FAILED, error=str(err), result_engine_id=err.engine_id)
        return EXIT_RECORDED
    logger.info("job %s built engine %s", spec.job_id, result.engine.id)
    return EXIT_RECORDED


JobRunner = Callable[[AppContext, ChildSpec], int]
# Job kind -> the function that runs one attempt of it in the child and returns an exit code.
JOB_RUNNERS: dict[str, JobRunner] = {"build": _run_build, "test_load": _run_test_load}
