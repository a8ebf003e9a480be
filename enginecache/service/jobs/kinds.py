"""Job kinds: what a kind's runner is handed and answers with, and the table from a job's `kind`
to the runner its child process calls.

A runner (`JobRunner`) runs one attempt in the child: it takes the attempt's `ChildSpec`, records
the job's terminal state under the lease (`ChildSpec.finish`) and returns `EXIT_RECORDED`.
`StaleLeaseError` means the lease was lost; any other exception is transient (the worker records
the traceback and retries).

The product's kinds are `build` and `test_load`. More kinds are added without changing the product:

- `ENGINECACHE_JOB_KINDS=module:attribute,...` in a worker's environment (`WorkerConfig.job_kinds`),
  each attribute a mapping from kind name to runner. The worker loads them when it starts (a bad
  entry stops it there, `BuildOptionError`) and hands the list to each attempt's child
  (`ChildSpec.job_kinds`), which loads them again: the zygote the child is forked from may have
  been made before the worker loaded them (a one-shot worker's is), and a spawned child has none;
- `register_job_kind(name, runner)`, in a process whose children are forked from it.

A product kind's name cannot be taken. The product's kinds are named here by "module:function", so
this module imports no kind (the kinds import this module).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session

from enginecache.core.fingerprint import HostFingerprint
from enginecache.db import queue
from enginecache.errors import BuildOptionError
from enginecache.service.context import AppContext

__all__ = [
    "EXIT_RECORDED",
    "JOB_KINDS_ENV",
    "ChildSpec",
    "JobRunner",
    "job_kinds_from_env",
    "job_runner",
    "load_job_kinds",
    "register_job_kind",
]

EXIT_RECORDED = 0  # the runner wrote the job's terminal state
JOB_KINDS_ENV = "ENGINECACHE_JOB_KINDS"


@dataclass(frozen=True)
class ChildSpec:
    """One attempt of a job, as the worker hands it to the child that runs it."""

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
    # The worker's added kinds ("module:attribute" entries, `load_job_kinds`).
    job_kinds: tuple[str, ...] = ()
    # The worker that supervises the attempt: a child that finds it gone right after asking to die
    # with its parent (the zygote may have exited between the fork and that request) exits.
    worker_pid: int | None = None
    # The job's staging folder (`service.jobs.staging`): what this attempt leaves for the next one,
    # owned by the job; the worker removes it once the job has ended.
    staging_dir: Path | None = None

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


JobRunner = Callable[[AppContext, ChildSpec], int]

# The product's kinds, resolved in the child that runs one.
PRODUCT_KINDS: dict[str, str] = {
    "build": "enginecache.service.builds.buildjob:run_build_job",
    "test_load": "enginecache.service.builds.testloadjob:run_test_load_job",
}

# Job kind -> the function that runs one attempt of it in the child and returns an exit code.
JOB_RUNNERS: dict[str, JobRunner] = {}


def register_job_kind(name: str, runner: JobRunner) -> None:
    """Add a job kind; registering the same runner again is a no-op. A product kind's name, or
    another runner under a taken name, is a programming error (ValueError): no kind is replaced."""
    current = JOB_RUNNERS.get(name)
    if current is None and name in PRODUCT_KINDS:
        raise ValueError(f"job kind {name!r} is the product's ({PRODUCT_KINDS[name]})")
    if current is not None and current is not runner:
        raise ValueError(f"job kind {name!r} is already registered to {current.__module__}.{current.__qualname__}")
    JOB_RUNNERS[name] = runner


def job_runner(kind: str) -> JobRunner | None:
    """The runner for `kind`; None for a kind nobody registered."""
    runner = JOB_RUNNERS.get(kind)
    if runner is None and kind in PRODUCT_KINDS:
        module, _, function = PRODUCT_KINDS[kind].partition(":")
        runner = JOB_RUNNERS.setdefault(kind, getattr(importlib.import_module(module), function))
    return runner


def job_kinds_from_env() -> tuple[str, ...]:
    """The "module:attribute" entries of $ENGINECACHE_JOB_KINDS (comma-separated; none when unset)."""
    return tuple(entry.strip() for entry in os.environ.get(JOB_KINDS_ENV, "").split(",") if entry.strip())


def load_job_kinds(entries: Iterable[str]) -> None:
    """Register the kinds of each "module:attribute" entry, whose attribute maps kind names to
    runners. BuildOptionError names an entry that is no such mapping or takes a name already taken."""
    for entry in entries:
        module_name, _, attribute = entry.partition(":")
        try:
            kinds = getattr(importlib.import_module(module_name), attribute) if module_name and attribute else None
        except (ImportError, AttributeError) as err:
            raise BuildOptionError(f"{JOB_KINDS_ENV}: {entry!r} names no job kinds: {err}") from err
        if not isinstance(kinds, Mapping) or not all(isinstance(k, str) and callable(r) for k, r in kinds.items()):
            raise BuildOptionError(f"{JOB_KINDS_ENV}: {entry!r} is not module:attribute of a mapping kind -> runner")
        for name, runner in kinds.items():
            try:
                register_job_kind(name, runner)
            except ValueError as err:
                raise BuildOptionError(f"{JOB_KINDS_ENV}: {entry!r}: {err}") from err
