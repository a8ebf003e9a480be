"""Job kinds: the table from a job's `kind` to the runner its child process calls.

The product's kinds are `build` and `test_load`. Another kind is added with `register_job_kind`
(in the child, before the job runs: the child looks its kind up here, `job_runner`). Test-only
kinds live in `enginecache.service.builds.testkinds` and are found only while `ENGINECACHE_TEST_JOB_KINDS=1`
is set in the worker's environment (`jobattempt.test_kinds_enabled`; the worker passes that
decision to each job's child in its spec): that module defines `JOB_KINDS: dict[str, JobRunner]`
and imports `service.jobs.attempt` only (never this module or `service.jobs.child`), so there is no
import cycle and no test code is imported in production.
"""

from __future__ import annotations

import importlib

from enginecache.service.jobs.attempt import TEST_KINDS_ENV, JobRunner, test_kinds_enabled

__all__ = ["JOB_RUNNERS", "TEST_KINDS_ENV", "job_runner", "register_job_kind", "test_kinds_enabled"]

TEST_KINDS_MODULE = "enginecache.service.builds.testkinds"

# The product's kinds, named by "module:function" so the job machinery imports no job kind (the
# kinds import the machinery); resolved in the child that runs one.
PRODUCT_KINDS: dict[str, str] = {
    "build": "enginecache.service.builds.buildjob:run_build_job",
    "test_load": "enginecache.service.builds.testloadjob:run_test_load_job",
}

# Job kind -> the function that runs one attempt of it in the child and returns an exit code.
JOB_RUNNERS: dict[str, JobRunner] = {}


def register_job_kind(name: str, runner: JobRunner) -> None:
    """Add a job kind; registering the same runner again is a no-op, another runner under a taken
    name is a programming error (ValueError), so no kind is replaced by accident."""
    current = JOB_RUNNERS.get(name)
    if current is not None and current is not runner:
        raise ValueError(f"job kind {name!r} is already registered to {current.__module__}.{current.__qualname__}")
    JOB_RUNNERS[name] = runner


def job_runner(kind: str, *, test_kinds: bool | None = None) -> JobRunner | None:
    """The runner for `kind`; None for a kind nobody registered. The test kinds are looked up only
    where `test_kinds` says so (by default: while `ENGINECACHE_TEST_JOB_KINDS=1` here); they are
    never added to the table, so they never outlive it. A job's child passes the flag its worker
    decided (`ChildSpec.test_kinds`): the fork server it came from may predate that environment."""
    runner = JOB_RUNNERS.get(kind)
    if runner is None and kind in PRODUCT_KINDS:
        module, _, function = PRODUCT_KINDS[kind].partition(":")
        runner = JOB_RUNNERS.setdefault(kind, getattr(importlib.import_module(module), function))
    if runner is None and (test_kinds_enabled() if test_kinds is None else test_kinds):
        runner = _test_kinds().get(kind)
    return runner


def _test_kinds() -> dict[str, JobRunner]:
    """The test-only kinds (a missing module is an error where they were asked for)."""
    module = importlib.import_module(TEST_KINDS_MODULE)
    return dict(module.JOB_KINDS)
