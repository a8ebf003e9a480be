"""Test-only job kinds: jobs whose child does nothing but take time or crash, so tests of the
queue and the worker (crash recovery, cancel, lease takeover, shutdown, timeout) need no real build.

- `sleep`, payload `{"seconds": N}`: sleeps N seconds in the child, reporting progress (phase
  "sleeping") about twice a second, then records SUCCEEDED.
- `crash`, payload `{"signal": "SIGKILL" | "SIGSEGV" | ..., "attempts": K}`: the child kills itself
  with that signal (its default action, as a parser's segfault would), on every attempt, or with
  `attempts` only on the first K attempts and records SUCCEEDED on later ones.
- `held_build`, a `build` job's payload plus `{"release_file": PATH, "hold_attempts": K}`: a real
  build whose first K attempts (default 1) stop between the build and the publish, say so (phase
  "held before publishing"), and wait there until PATH exists (at most `hold_max_seconds`, default
  300, then the attempt fails: it never waits forever); then the lease is checked and the engine
  published as any build's. The fleet simulation cuts a host's link while its job is held there.

They exist only where the environment has ``ENGINECACHE_TEST_JOB_KINDS=1``: set it in a worker's
environment (its fork server and job children inherit it) to let that worker run them. Without
it they are unknown, and a job of either kind fails with "unknown job kind" like any other
unregistered kind. The job-kind table adds `TEST_JOB_RUNNERS` only when `enabled()`.

This module imports `service.jobs.attempt` (the spec and exit codes) and, inside `run_held_build`,
`service.builds.buildjob`; never the job-kind table or `service.jobs.child`, which import it: no import cycle.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import BuildFailedError
from enginecache.service.context import AppContext
from enginecache.service.jobs.attempt import EXIT_RECORDED, ChildSpec, JobRunner
from enginecache.service.jobs.attempt import TEST_KINDS_ENV as ENABLE_ENV
from enginecache.service.jobs.attempt import test_kinds_enabled as enabled

__all__ = ["ENABLE_ENV", "JOB_KINDS", "TEST_JOB_RUNNERS", "enabled", "run_crash", "run_held_build", "run_sleep"]

PROGRESS_SECONDS = 0.5


def run_sleep(app: AppContext, spec: ChildSpec) -> int:
    """Sleep `payload["seconds"]`, reporting progress, then record SUCCEEDED."""
    seconds = max(0.0, float(spec.payload.get("seconds", 1.0)))
    start = time.monotonic()
    end = start + seconds
    while True:
        now = time.monotonic()
        slept = min(seconds, now - start)
        queue.report_progress(
            app.catalog,
            spec.job_id,
            spec.token,
            progress=min(0.99, slept / seconds) if seconds else 0.99,
            phase="sleeping",
            log_tail=f"attempt {spec.attempt}: slept {slept:.1f} of {seconds:g} s",
        )
        if now >= end:
            break
        time.sleep(min(PROGRESS_SECONDS, end - now))
    spec.finish(app, JobStatus.SUCCEEDED)
    return EXIT_RECORDED


def run_crash(app: AppContext, spec: ChildSpec) -> int:
    """Kill this child with `payload["signal"]` (on the first `payload["attempts"]` attempts, or on
    every attempt); record SUCCEEDED on an attempt past those."""
    name = str(spec.payload.get("signal", "SIGKILL"))
    try:
        signum = signal.Signals[name]
    except KeyError:
        spec.finish(app, JobStatus.FAILED, error=f"crash job: unknown signal {name!r}")
        return EXIT_RECORDED
    crash_attempts = spec.payload.get("attempts")
    if crash_attempts is not None and spec.attempt > int(crash_attempts):
        spec.finish(app, JobStatus.SUCCEEDED)
        return EXIT_RECORDED
    queue.report_progress(app.catalog, spec.job_id, spec.token, phase=f"raising {name}")
    if signum not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(signum, signal.SIG_DFL)  # die by the signal's default action, not a Python handler
    os.kill(os.getpid(), signum)
    spec.finish(app, JobStatus.FAILED, error=f"crash job: {name} did not end the child")
    return EXIT_RECORDED


HOLD_POLL_SECONDS = 0.05
HELD_PHASE = "held before publishing"


def run_held_build(app: AppContext, spec: ChildSpec) -> int:
    """A real build that waits before publishing on its first attempts (module docstring)."""
    from enginecache.service.builds.buildjob import run_build_job  # here: the kinds table imports buildjob too

    release = Path(str(spec.payload["release_file"]))
    limit = float(spec.payload.get("hold_max_seconds", 300.0))

    def hold() -> None:
        if spec.attempt > int(spec.payload.get("hold_attempts", 1)):
            return
        queue.report_progress(app.catalog, spec.job_id, spec.token, phase=HELD_PHASE)
        deadline = time.monotonic() + limit
        while not release.exists():
            if time.monotonic() > deadline:
                raise BuildFailedError(f"held build: {release} did not appear within {limit:g} s")
            time.sleep(HOLD_POLL_SECONDS)

    return run_build_job(app, spec, hold=hold)


# Job kind -> runner, added to the job-kind table only where `enabled()`.
TEST_JOB_RUNNERS: dict[str, JobRunner] = {"sleep": run_sleep, "crash": run_crash, "held_build": run_held_build}
JOB_KINDS = TEST_JOB_RUNNERS  # the name `service.jobs.kinds` reads
