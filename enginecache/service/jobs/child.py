"""The child process that runs one job attempt: isolated, in its own process group and
working directory, writing progress and its result under the job's lease token.

What it runs is its kind's runner (`service.jobs.kinds`), as the job's submitter; it answers the
worker with its exit code (`EXIT_RECORDED`, `EXIT_TRANSIENT`, `EXIT_LEASE_LOST`) and, after an
unexpected error, the traceback in `CHILD_ERROR_FILE` in its working directory.
"""

from __future__ import annotations

import logging
import os
import signal
import traceback

from enginecache.core.processes import die_with_parent, pid_alive
from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import StaleLeaseError
from enginecache.service.access import audit
from enginecache.service.context import AppContext
from enginecache.service.jobs.kinds import EXIT_RECORDED, ChildSpec, job_runner, load_job_kinds

logger = logging.getLogger(__name__)

EXIT_TRANSIENT = 3  # an unexpected error: the parent counts the attempt and retries
EXIT_LEASE_LOST = 4  # the lease was taken over: nothing of ours was written
CHILD_ERROR_FILE = "child-error.txt"  # an unexpected error's traceback, for the parent to record


def run_child(spec: ChildSpec) -> None:
    """Entry point of the child process (multiprocessing target); exits with one of the codes above."""
    os.setsid()  # own process group: cancel and timeout kill the whole group
    try:
        # A worker killed outright (SIGKILL, OOM) leaves no build running on its own: the process
        # that forked us (the worker's zygote) exits with the worker, and we with it.
        die_with_parent()
    except OSError as err:
        logger.warning("job %s: %s", spec.job_id, err)
    if spec.worker_pid is not None and not pid_alive(spec.worker_pid):
        # The worker died before the request above took effect (a fork clears the death signal):
        # no build may run on alone, unsupervised.
        os._exit(EXIT_LEASE_LOST)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides; a terminal ^C must not reach us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    app = AppContext(home=spec.home, db_url=spec.db_url, tmp_dir=spec.work_dir)
    try:
        load_job_kinds(spec.job_kinds)  # before the chdir: an entry may be found from the worker's directory
        os.chdir(spec.work_dir)
        code = _run(app, spec)
    except StaleLeaseError as err:
        logger.warning("job %s attempt %s: %s", spec.job_id, spec.attempt, err)
        code = EXIT_LEASE_LOST
    except Exception:
        logger.exception("job %s attempt %s failed", spec.job_id, spec.attempt)
        (spec.work_dir / CHILD_ERROR_FILE).write_text(traceback.format_exc())
        code = EXIT_TRANSIENT
    finally:
        app.close()
    os._exit(code)


def _run(app: AppContext, spec: ChildSpec) -> int:
    """The kind's runner, acting as the job's submitter (`audit.job_actor`): what it changes is
    recorded as theirs, from this worker."""
    runner = job_runner(spec.kind)
    if runner is None:
        spec.finish(app, JobStatus.FAILED, error=f"unknown job kind {spec.kind!r}")
        return EXIT_RECORDED
    submitted_by = queue.get_job(app.catalog, spec.job_id).submitted_by
    with audit.acting_as(audit.job_actor(submitted_by, spec.job_id)):
        return runner(app, spec)
