"""The `build` job kind: plan the build on this worker, then run it, writing progress under the lease."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable

from sqlmodel import Session

from enginecache.core.backends.base import ProgressEvent
from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import BuildFailedError, EngineCacheError
from enginecache.service.builds import BuildResult, find_ready_engine, plan_build, run_build
from enginecache.service.context import AppContext
from enginecache.service.jobattempt import EXIT_RECORDED, ChildSpec
from enginecache.service.jobs import request_from_payload

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_SECONDS = 0.5
LOG_TAIL_LINES = 30


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


def run_build_job(app: AppContext, spec: ChildSpec) -> int:
    """JOB_RUNNERS entry for `build`. The plan is made again here: a worker whose host would give
    another cache key than the one submitted fails the job rather than build a different engine."""
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
