"""One job attempt as the worker hands it to its child process, and what the child answers.

The worker (parent) and the child (`service.jobs.child`) agree on three things, all here: the
`ChildSpec` the child is started with, the exit code it leaves with, and the file an unexpected
error's traceback is written to. A job kind's runner (`JobRunner`, table in `service.jobs.kinds`)
takes the attempt's spec and records the job's terminal state under its lease, so it imports this
module and neither the table nor the child: no import cycle.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session

from enginecache.core.fingerprint import HostFingerprint
from enginecache.db import queue
from enginecache.service.context import AppContext

EXIT_RECORDED = 0  # the child wrote the job's terminal state
EXIT_TRANSIENT = 3  # an unexpected error: the parent counts the attempt and retries
EXIT_LEASE_LOST = 4  # the lease was taken over: nothing of ours was written
CHILD_ERROR_FILE = "child-error.txt"  # an unexpected error's traceback, for the parent to record


# The switch for the test-only job kinds (service.builds.testkinds): decided in the worker from its own
# environment and passed to each child in its spec (`ChildSpec.test_kinds`).
TEST_KINDS_ENV = "ENGINECACHE_TEST_JOB_KINDS"


def test_kinds_enabled() -> bool:
    """Whether this process's environment lets its jobs run the test-only kinds."""
    return os.environ.get(TEST_KINDS_ENV) == "1"


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
    # Whether the worker that claimed the job may run the test-only kinds: decided in the worker
    # from its own environment, so a fork server started earlier (under another environment) does
    # not decide it for the child.
    test_kinds: bool = False
    # The worker that supervises the attempt: a child that finds it gone right after asking to die
    # with its parent (the fork server may have exited between the fork and that request) exits.
    worker_pid: int | None = None

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


# Runs one attempt of a job kind in the child; returns the exit code (EXIT_RECORDED once it wrote
# the job's terminal state). StaleLeaseError means the lease was lost; any other exception is
# transient (the parent records the traceback and retries).
JobRunner = Callable[[AppContext, ChildSpec], int]
