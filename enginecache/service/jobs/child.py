"""The child process that runs one job attempt: isolated, in its own process group and
working directory, writing progress and its result under the job's lease token.

What it runs is its kind's runner (`service.jobs.kinds`); what it is handed and answers with is
`service.jobs.attempt`.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback

from enginecache.core.processes import pid_alive
from enginecache.db.models import JobStatus
from enginecache.errors import StaleLeaseError
from enginecache.service.context import AppContext
from enginecache.service.jobs.attempt import CHILD_ERROR_FILE, EXIT_LEASE_LOST, EXIT_RECORDED, EXIT_TRANSIENT, ChildSpec
from enginecache.service.jobs.kinds import job_runner

logger = logging.getLogger(__name__)


def _die_with_parent() -> None:
    """On Linux, get SIGKILL when the fork server that made us exits (it exits with its worker), so
    a worker killed outright (SIGKILL, OOM) leaves no build running on its own."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        logger.warning("prctl(PR_SET_PDEATHSIG) failed: errno %s", ctypes.get_errno())


def run_child(spec: ChildSpec) -> None:
    """Entry point of the child process (multiprocessing target); exits with a code of `jobattempt`."""
    os.setsid()  # own process group: cancel and timeout kill the whole group
    _die_with_parent()
    if spec.worker_pid is not None and not pid_alive(spec.worker_pid):
        # The worker died before the request above took effect (a fork server exits with its
        # worker, and a fork clears the death signal): no build may run on alone, unsupervised.
        os._exit(EXIT_LEASE_LOST)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker decides; a terminal ^C must not reach us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.chdir(spec.work_dir)
    app = AppContext(home=spec.home, db_url=spec.db_url, tmp_dir=spec.work_dir)
    try:
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
    runner = job_runner(spec.kind, test_kinds=spec.test_kinds)
    if runner is None:
        spec.finish(app, JobStatus.FAILED, error=f"unknown job kind {spec.kind!r}")
        return EXIT_RECORDED
    return runner(app, spec)
