"""Helpers of the `enginecache gc` tests (tests/test_gc_*.py): ages set on files, gc run on an
injected clock, the rows and engines a test needs."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.maintenance.gc.collect import collect_garbage
from enginecache.service.maintenance.gc.report import GcPolicy, GcReport
from enginecache.service.models.register import register_model
from tests.conftest import FakeClock

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0
DAY = 24 * HOUR
BOUND = 120.0  # seconds: generous; a wait that runs past it is a failure, not a slow pass


def set_age(path: Path, seconds: float) -> None:
    """Make `path` (and what is below it) look `seconds` old to a clock at real time."""
    then = time.time() - seconds
    for item in [*(path.rglob("*") if path.is_dir() else ()), path]:
        os.utime(item, (then, then), follow_symlinks=False)


def run_gc(app: AppContext, clock: FakeClock, *, apply: bool, **policy: timedelta) -> GcReport:
    return collect_garbage(app, apply=apply, policy=GcPolicy(**policy), clock=clock)


def removed_paths(report: GcReport, kind: str | None = None) -> set[str]:
    return {r.path for r in report.removals if kind is None or r.kind == kind}


def ort_engine(app: AppContext, model: Path, name: str) -> EngineRecord:
    register_model(app, model, name=name)
    engine = build_engine(app, BuildRequest(model=name, backend="ort")).engine
    assert engine.status == EngineStatus.READY and engine.blob_path is not None
    return engine


def dead_pid() -> int:
    """A pid no process can have: past the kernel's pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


def add_engine_row(app: AppContext, model_id: int, *, status: str = EngineStatus.PENDING, **fields: Any) -> int:
    """An engine row as a build leaves it (PENDING unless told otherwise); its id."""
    row = EngineRecord(
        model_id=model_id,
        backend="ort",
        backend_version="1",
        precision="fp32",
        targets="cpu",
        cache_key="k" * 64,
        onnx_digest="d" * 64,
        os="Linux",
        status=status,
        **fields,
    )
    with app.catalog.write() as session:
        session.add(row)
        session.flush()
        return row.id or 0


def add_job_row(app: AppContext, status: JobStatus, attempts: int) -> int:
    with app.catalog.write() as session:
        job = JobRecord(kind="build", status=status, attempts=attempts)
        session.add(job)
        session.flush()
        return job.id or 0
