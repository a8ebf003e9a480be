"""Job kinds for tests only: jobs whose child does nothing but take time or crash, so tests of the
queue and the worker (crash recovery, cancel, lease takeover, shutdown, timeout) need no real build.

- `sleep`, payload `{"seconds": N}`: sleeps N seconds in the child, reporting progress (phase
  "sleeping") about twice a second, then records SUCCEEDED.
- `crash`, payload `{"signal": "SIGKILL" | "SIGSEGV" | ..., "attempts": K}`: the child kills itself
  with that signal (its default action, as a parser's segfault would), on every attempt, or with
  `attempts` only on the first K attempts and records SUCCEEDED on later ones.
- `held_build`, a `build` job's payload plus `{"release_file": PATH, "hold_attempts": K}`: a real
  build whose first K attempts (default 1) stop between the build and the publish, say so (phase
  `HELD_PHASE`), and wait there until PATH exists (at most `hold_max_seconds`, default 300, then the
  attempt fails: it never waits forever); then the lease is checked and the engine published as any
  build's. Made with the product's `build_job_runner`.

A worker runs them where its environment names them as any added job kinds are named:
`ENGINECACHE_JOB_KINDS=tests.jobkinds_for_tests:JOB_KINDS` (`ENV`, `env()`), with the repository's
root on its import path. Elsewhere they are unknown job kinds.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import BuildFailedError
from enginecache.service.builds.buildjob import build_job_runner
from enginecache.service.context import AppContext
from enginecache.service.jobs.kinds import EXIT_RECORDED, JOB_KINDS_ENV, ChildSpec, JobRunner

PROGRESS_SECONDS = 0.5
HOLD_POLL_SECONDS = 0.05
HELD_PHASE = "held before publishing"
ENTRY = f"{__name__}:JOB_KINDS"
ENV = {JOB_KINDS_ENV: ENTRY}  # the environment that lets a worker run these kinds


def env(**extra: str) -> dict[str, str]:
    """This process's environment, these kinds named in it, and `extra`."""
    return {**os.environ, **ENV, **extra}


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


def hold_until_released(app: AppContext, spec: ChildSpec) -> None:
    """On the first `hold_attempts` attempts: say so, then wait until `release_file` exists."""
    if spec.attempt > int(spec.payload.get("hold_attempts", 1)):
        return
    release = Path(str(spec.payload["release_file"]))
    limit = float(spec.payload.get("hold_max_seconds", 300.0))
    queue.report_progress(app.catalog, spec.job_id, spec.token, phase=HELD_PHASE)
    deadline = time.monotonic() + limit
    while not release.exists():
        if time.monotonic() > deadline:
            raise BuildFailedError(f"held build: {release} did not appear within {limit:g} s")
        time.sleep(HOLD_POLL_SECONDS)


JOB_KINDS: dict[str, JobRunner] = {
    "sleep": run_sleep,
    "crash": run_crash,
    "held_build": build_job_runner(hold_until_released),
}
