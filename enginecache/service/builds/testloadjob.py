"""The `test_load` job kind: test-load the engine on this worker and record the run under the lease.

A test-load that ends in a verdict records its load run and the job's state in one transaction:
SUCCEEDED for PASS, FAIL, INCOMPATIBLE and CORRUPT, FAILED (with the run's reason, not retried)
for ERROR: bad inputs, inputs the model rejects, a shape too large to generate, a load or inference
the backend refused are deterministic, so another attempt would only fail again. A missing engine
fails the job with nothing recorded. Only the unexpected is transient (the worker retries): an
unavailable catalog or store, or an exception outside the error tree (a bug, a crash).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlmodel import Session

from enginecache.core.validate import ERROR
from enginecache.db import queue
from enginecache.db.models import JobStatus, LoadRunRecord
from enginecache.errors import EngineCacheError, StaleLeaseError, UnavailableError
from enginecache.service.builds.testload import DEFAULT_ITERATIONS, TestLoadOptions, run_test_load
from enginecache.service.context import AppContext
from enginecache.service.jobs.kinds import EXIT_RECORDED, ChildSpec


def run_test_load_job(app: AppContext, spec: ChildSpec) -> int:
    """JOB_RUNNERS entry for `test_load` (the module docstring says which outcome ends how)."""
    payload = spec.payload
    engine_id = int(payload["engine_id"])

    def commit(mutate: Callable[[Session], None], record: LoadRunRecord) -> None:
        if record.verdict == ERROR:
            error = f"test-load ERROR: {record.reason}"
            spec.finish(app, JobStatus.FAILED, error=error, result_engine_id=engine_id, on_commit=mutate)
        else:
            spec.finish(app, JobStatus.SUCCEEDED, result_engine_id=engine_id, on_commit=mutate)

    queue.report_progress(app.catalog, spec.job_id, spec.token, progress=0.1, phase="test-load")
    try:
        options = TestLoadOptions(
            iterations=int(payload.get("iterations", DEFAULT_ITERATIONS)),
            batch=payload.get("batch"),
            inputs=Path(payload["inputs"]) if payload.get("inputs") else None,
            tolerances=payload.get("tolerances") or None,
        )
        run_test_load(app, engine_id, options, host=spec.host, job_id=spec.job_id, commit=commit)
    except (StaleLeaseError, UnavailableError):
        raise  # lease lost / transient: the child's exit code says which
    except EngineCacheError as err:  # the engine or its model row is gone: nothing to record a run against
        spec.finish(app, JobStatus.FAILED, error=str(err), result_engine_id=engine_id)
    return EXIT_RECORDED
