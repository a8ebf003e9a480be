"""The catalog's status names as the CLI and the dashboard compare, list and colour them: an
engine's (`EngineStatus`), a model's (`ModelStatus`), a job's (`JobStatus`, with the groups
`ACTIVE_JOB_STATUSES` and `TERMINAL_JOB_STATUSES`), and `JobProgress`, what a waiting command reads
of a job on each change. The enums are `str`s: a status compares equal to its name.

Imports the catalog's tables (SQLModel): a read command that must stay light compares names instead.
"""

from __future__ import annotations

from typing import Protocol

from enginecache.db.models import (
    ACTIVE_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    EngineStatus,
    JobStatus,
    ModelStatus,
)

__all__ = [
    "ACTIVE_JOB_STATUSES",
    "TERMINAL_JOB_STATUSES",
    "EngineStatus",
    "JobProgress",
    "JobStatus",
    "ModelStatus",
]


class JobProgress(Protocol):
    """A job as a progress display reads it (`service.builds.submitwait.run_and_wait`'s `on_update`)."""

    @property
    def status(self) -> str: ...

    @property
    def phase(self) -> str | None: ...

    @property
    def progress(self) -> float: ...
