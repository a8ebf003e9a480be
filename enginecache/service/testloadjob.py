"""The `test_load` job kind: test-load the engine on this worker and record the run under the lease."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlmodel import Session

from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import EngineCacheError, StaleLeaseError
from enginecache.service.context import AppContext
from enginecache.service.jobattempt import EXIT_RECORDED, ChildSpec
from enginecache.service.testload import DEFAULT_ITERATIONS, run_test_load


def run_test_load_job(app: AppContext, spec: ChildSpec) -> int:
    """JOB_RUNNERS entry for `test_load`: the load run and the job's SUCCEEDED state are written in
    one transaction that checks the lease; bad input fails the job (a verdict, not an error, is
    what a test-load that ran records)."""
    payload = spec.payload
    engine_id = int(payload["engine_id"])

    def commit(mutate: Callable[[Session], None]) -> None:
        spec.finish(app, JobStatus.SUCCEEDED, result_engine_id=engine_id, on_commit=mutate)

    queue.report_progress(app.catalog, spec.job_id, spec.token, progress=0.1, phase="test-load")
    try:
        run_test_load(
            app,
            engine_id,
            iterations=int(payload.get("iterations", DEFAULT_ITERATIONS)),
            batch=payload.get("batch"),
            inputs=Path(payload["inputs"]) if payload.get("inputs") else None,
            tolerances=payload.get("tolerances") or None,
            host=spec.host,
            job_id=spec.job_id,
            commit=commit,
        )
    except StaleLeaseError:
        raise
    except EngineCacheError as err:
        spec.finish(app, JobStatus.FAILED, error=str(err), result_engine_id=engine_id)
    return EXIT_RECORDED
