"""The catalog's status names as the CLI and the dashboard compare, list and colour them: an
engine's (`EngineStatus`), a model's (`ModelStatus`), a job's (`JobStatus`, with the groups
`ACTIVE_JOB_STATUSES` and `TERMINAL_JOB_STATUSES`), and `JobProgress` (from `jobprogress`), what a waiting
command reads of a job on each change. The enums are `str`s: a status compares equal to its name.

Imports the catalog's tables (SQLModel): a read command that must stay light compares names instead.
"""

from __future__ import annotations

from enginecache.db.models import (
    ACTIVE_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    EngineStatus,
    JobStatus,
    ModelStatus,
)
from enginecache.service.readmodels.jobprogress import JobProgress

__all__ = [
    "ACTIVE_JOB_STATUSES",
    "TERMINAL_JOB_STATUSES",
    "EngineStatus",
    "JobProgress",
    "JobStatus",
    "ModelStatus",
]
