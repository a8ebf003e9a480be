"""A job's staging folder: what one attempt of a job leaves for the next, in the store's `tmp/` as
`job-<id>.staged/`.

Its owner is the job, not an attempt (an attempt's own folder, `job-<id>-<attempt>-<pid>`, goes with
the attempt): the worker that sees the job end, in any terminal state, removes it
(`service.jobs.supervisor`), and `enginecache gc` removes one whose job is no longer QUEUED or RUNNING
(terminal, or gone) once nothing in it changed for the temp age: a worker that died before it could
(service.maintenance.gc.plan). What goes in it is the job kind's: a build keeps the engine it built and
its digests there until it is published (service.builds.stagedengine).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

STAGING_SUFFIX = ".staged"
_NAME = re.compile(r"job-(\d+)\.staged")


def staging_dir(tmp_dir: Path, job_id: int) -> Path:
    """Job `job_id`'s staging folder in the store's `tmp_dir` (it may not exist)."""
    return tmp_dir / f"job-{job_id}{STAGING_SUFFIX}"


def staging_job_id(name: str) -> int | None:
    """The job whose staging folder an entry of `tmp/` named `name` is, or None."""
    found = _NAME.fullmatch(name)
    return int(found.group(1)) if found else None


def remove_staging(folder: Path) -> None:
    """Remove a staging folder and everything in it (gone already: nothing to do). OSError where
    removing fails."""
    with contextlib.suppress(FileNotFoundError):
        shutil.rmtree(folder)
