"""The `build` job kind: plan the build on this worker, then run it, writing progress under the lease.

How an attempt that fails ends is decided by what caused it (`failure_is_transient`), however the
error was wrapped on the way up (a BuildFailedError carries the backend's or the converter's error
as its cause):

- transient: an UnavailableError (the catalog or the store) or an OSError of the host's disks
  (ENOSPC, EDQUOT, EIO) anywhere among the causes, or a build that failed where the disk under its
  working folder has no room left for an engine (`disk_too_full`: a runtime that hides the errno).
  The attempt is counted and the job retried after a backoff, DEAD once out of attempts (the child
  raises; `service.jobs.supervisor` records it);
- deterministic, any other EngineCacheError (a BadInputError such as ExternalDataError or
  PrecisionError among the causes, the backend's own refusal, a CORRUPT model). The job is FAILED
  on this attempt: the same input fails the same way on every attempt;
- an exception from outside the tree is unexpected: retried like a transient one (the parent
  records its traceback).

An attempt that fails after its engine was built (the remote store unreachable during the upload,
the catalog down at the READY write, the attempt killed part way) does not cost the next attempt a
build: the engine is kept in the job's staging folder with its digests once it is built and proven
loadable (service.builds.stagedengine), and the next attempt hashes it again and publishes it without
calling the backend (its log says so: "[staged] not built again: ..."). The folder is the job's; the
worker removes it once the job ends, gc where a worker died (service.jobs.staging).

Before anything is built, a model with external data has its offsets and lengths checked again
(`core.onnx_info.check_external_data`, the model's proto only): a model registered before `model add`
checked them may name bytes its files do not hold, which a converter or a backend would fail on
(or crash on) the same way every attempt.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlmodel import Session

from enginecache.core.backends.base import ProgressEvent
from enginecache.core.onnx_info import check_external_data, model_digest
from enginecache.db import queue
from enginecache.db.models import JobStatus, ModelRecord
from enginecache.errors import (
    EngineCacheError,
    ExternalDataError,
    InvalidModelError,
    StaleLeaseError,
    StoreError,
    UnavailableError,
)
from enginecache.service.builds.plan import BuildResult, find_ready_engine, plan_build, run_build
from enginecache.service.builds.stagedengine import EngineStaging
from enginecache.service.builds.submit import request_from_payload
from enginecache.service.context import AppContext
from enginecache.service.jobs.kinds import EXIT_RECORDED, ChildSpec, JobRunner
from enginecache.service.models.register import model_path
from enginecache.service.models.verify import ensure_bundle_here

logger = logging.getLogger(__name__)

PROGRESS_INTERVAL_SECONDS = 0.5
LOG_TAIL_LINES = 30
# OSErrors that say the host's disks are full or failing, not that the input is wrong.
HOST_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO})
# When a failure is judged by the space left (`disk_too_full`): a build writes an engine about its
# model's size (the model itself is linked, not copied, except for a converter), so less room than
# the model's size and this much is a full disk.
DISK_MARGIN_BYTES = 16 * 2**20
# What hashing a stored bundle raises where one of its files is gone (it is not what was registered).
_GONE = (ExternalDataError, FileNotFoundError, IsADirectoryError, NotADirectoryError)


def causes(err: BaseException) -> Iterator[BaseException]:
    """`err` and the chain it was raised from (`raise ... from`), outermost first, each once. An
    exception merely raised while handling another (a cleanup that failed) is not its cause."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__


def failure_is_transient(err: BaseException) -> bool:
    """Whether an attempt that failed with `err` may succeed when retried: the catalog or the store
    was unavailable, or a disk was full or failing, whatever wrapped that on the way up."""
    return any(isinstance(e, UnavailableError) or _host_disk_error(e) for e in causes(err))


def disk_too_full(folder: Path, need_bytes: int) -> bool:
    """Whether the filesystem holding `folder` has less room than `need_bytes` left: a build there
    cannot write its engine, whatever its runtime said about it (ONNX Runtime's "Failed to save"
    names no errno). False where the folder is gone or cannot be asked."""
    try:
        st = os.statvfs(folder)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < need_bytes


def _host_disk_error(err: BaseException) -> bool:
    return isinstance(err, OSError) and err.errno in HOST_DISK_ERRNOS


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

    def fence(self) -> None:
        """Write the progress now, under the lease: StaleLeaseError where the job was taken over."""
        self.flush(force=True)

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


# Called in the child between a build and its publish: it may approve, wait or refuse (raise).
BeforePublish = Callable[[AppContext, ChildSpec], None]


def build_job_runner(before_publish: BeforePublish) -> JobRunner:
    """A runner for a job kind of your own (`service.jobs.kinds`) that builds as `build` does and
    calls `before_publish(app, spec)` once the engine is built, before the lease is checked again
    and the engine published. An EngineCacheError it raises fails the attempt as a build error
    does; it runs in the job's child, so it may take its time (the worker renews the lease)."""

    def run(app: AppContext, spec: ChildSpec) -> int:
        return run_build_job(app, spec, before_publish=before_publish)

    return run


def run_build_job(app: AppContext, spec: ChildSpec, *, before_publish: BeforePublish | None = None) -> int:
    """The `build` kind's runner. The plan is made again here: a worker whose host would give
    another cache key than the one submitted fails the job rather than build a different engine.
    A failure ends the job FAILED on this attempt unless it is transient (module docstring). The
    lease is checked once more between the build and the publish (`ProgressWriter.fence`), after
    `before_publish` where given (`build_job_runner`)."""
    request = request_from_payload(spec.payload)
    try:
        plan = plan_build(app, request, host=spec.host)
        ensure_bundle_here(app, plan.model)  # a fleet's build host fetches it from the remote store
        refuse_bad_external_data(app, plan.model)
    except StaleLeaseError:
        raise
    except EngineCacheError as err:
        return _failed(app, spec, err)
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

    def fence() -> None:
        if before_publish is not None:
            before_publish(app, spec)
        writer.fence()

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
            before_publish=fence,
            staging=EngineStaging(spec.staging_dir, spec.job_id, spec.attempt) if spec.staging_dir else None,
        )
    except StaleLeaseError:
        raise
    except EngineCacheError as err:  # BuildFailedError (the engine row is FAILED), or around the build
        writer.flush(force=True)
        if not failure_is_transient(err) and disk_too_full(spec.work_dir, plan.model.size_bytes + DISK_MARGIN_BYTES):
            raise StoreError(f"the disk under {spec.work_dir.parent} is full: {err}") from err  # retried
        return _failed(app, spec, err, engine_id=getattr(err, "engine_id", None))
    logger.info("job %s built engine %s", spec.job_id, result.engine.id)
    return EXIT_RECORDED


def _failed(app: AppContext, spec: ChildSpec, err: EngineCacheError, *, engine_id: int | None = None) -> int:
    """FAILED on this attempt; a transient failure is raised instead, for the parent to retry."""
    if failure_is_transient(err):
        logger.warning("job %s attempt %s: transient failure, to be retried: %s", spec.job_id, spec.attempt, err)
        raise err
    spec.finish(app, JobStatus.FAILED, error=str(err), result_engine_id=engine_id)
    return EXIT_RECORDED


def refuse_bad_external_data(app: AppContext, model: ModelRecord) -> None:
    """Raise ExternalDataError where the stored model names external bytes its files do not hold
    (offsets or lengths `model add` did not check when it was registered). A stored bundle that is
    no longer what was registered is left to the build's own integrity check, which names it."""
    files = tuple(str(name) for name in model.info.get("external_data_files") or ())
    if not files:
        return
    path = model_path(app, model)
    try:
        check_external_data(path)
    except InvalidModelError:
        if _as_registered(path, files, model.digest):
            raise
        logger.warning("model %s: its stored bundle changed since it was registered", model.id)


def _as_registered(path: Path, files: tuple[str, ...], digest: str) -> bool:
    """Whether the stored bundle still hashes to the digest it was registered under."""
    try:
        return model_digest(path, files) == digest
    except _GONE:
        return False
