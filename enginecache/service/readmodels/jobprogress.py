"""A job's progress and duration as every view shows them: the one reading of a job row's status,
phase and progress that the Build view's job cards, its matrix and an engine's test-load line share,
so they never say different things about the same job.

A RUNNING job's progress is what its worker reported (`db.queue.report_progress`: the share of the
outermost build phase's steps, the newest phase). Until it reports any (a claim sets phase
"claimed" and progress 0; a short build, a precision conversion or an ONNX Runtime build may report
none), the job is "starting" with no fraction: a view draws no bar rather than an empty one. The
queue's own word "claimed" is never shown. Durations come from the row's timestamps against `now`
(injected, so tests need no sleeps): queued for (created -> now), running for (started -> now), and
for a finished job the time it took (started -> finished) and how long it waited before."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

CLAIMED = "claimed"  # the phase db.queue.claim writes: no progress reported yet
QUEUED, RUNNING = "QUEUED", "RUNNING"


class JobProgress(Protocol):
    """A job as a progress display reads it (`service.builds.submitwait.run_and_wait`'s `on_update`)."""

    @property
    def status(self) -> str: ...

    @property
    def phase(self) -> str | None: ...

    @property
    def progress(self) -> float: ...


class JobTimes(JobProgress, Protocol):
    """What `job_progress` reads of a job (a `readmodels.jobs.JobRow` or a `JobRecord`)."""

    @property
    def created_at(self) -> datetime: ...

    @property
    def started_at(self) -> datetime | None: ...

    @property
    def finished_at(self) -> datetime | None: ...


@dataclass(frozen=True)
class ProgressView:
    fraction: float | None  # a bar's fill for a RUNNING job that reported progress; None: draw no bar
    words: str  # "building engine · 67%", "starting", "waiting for a worker", "" for a finished job
    duration: str  # "queued for 4.0 s", "running for 12 s", "took 7.3 s (queued 0.4 s)"


def phase_words(status: str, phase: str | None) -> str | None:
    """The phase a view shows for a job: none once it is finished (its last phase is stale) or while
    QUEUED without one, "starting" for a RUNNING job no worker has reported on yet (never the
    queue's "claimed"), else the phase its worker reported."""
    if status == RUNNING and (not phase or phase == CLAIMED):
        return "starting"
    return phase if status in (QUEUED, RUNNING) else None


def job_progress(job: JobTimes, now: datetime | None = None) -> ProgressView:
    """How far `job` is, in words and as a fraction, and how long it has taken, at `now` (default: now)."""
    now = now or datetime.now(UTC)
    status = str(job.status)
    if status == QUEUED:
        return ProgressView(None, "waiting for a worker", f"queued for {seconds_text(_since(job.created_at, now))}")
    if status == RUNNING:
        started = job.started_at or job.created_at
        duration = f"running for {seconds_text(_since(started, now))}"
        phase = phase_words(status, job.phase)
        fraction = max(0.0, min(1.0, float(job.progress)))
        if fraction <= 0.0:
            return ProgressView(None, str(phase), duration)
        percent = f"{fraction:.0%}"
        return ProgressView(fraction, f"{phase} · {percent}" if phase != "starting" else percent, duration)
    if job.started_at is not None and job.finished_at is not None:
        took = f"took {seconds_text(_since(job.started_at, job.finished_at))}"
        waited = _since(job.created_at, job.started_at)
        return ProgressView(None, "", f"{took} (queued {seconds_text(waited)})" if waited >= 1.0 else took)
    if job.finished_at is not None:  # cancelled or failed before any worker started it
        return ProgressView(None, "", f"ended after {seconds_text(_since(job.created_at, job.finished_at))}")
    return ProgressView(None, "", "")


def seconds_text(seconds: float) -> str:
    """'0.4 s', '7.3 s', '42 s', '3 min 05 s', '2 h 04 min'."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    whole = int(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _since(start: datetime, end: datetime) -> float:
    """Seconds from `start` to `end`; a naive timestamp (SQLite hands them back so) is UTC."""
    return (_aware(end) - _aware(start)).total_seconds()


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
