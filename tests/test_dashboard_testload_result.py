"""A test-load started from an engine's page shows its outcome there, under the buttons, once its
job ends (issue 28, point 6), and the engine's "Verified" reads the run's verified read."""

from __future__ import annotations

import pytest
from sqlmodel import select

from enginecache.db.models import JobRecord, JobStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from tests.dashboardkit import Seeded, engine_view, plain


@pytest.fixture
def ort_engine(seeded: Seeded) -> int:
    """An ONNX Runtime engine of the seeded convnet: it test-loads on this machine's CPU."""
    return int(build_engine(seeded.app, BuildRequest(model="convnet", backend="ort")).engine.id or 0)


def _finish(seeded: Seeded, job_id: int, status: str, error: str | None = None) -> None:
    """What the worker's commit does to the job once the run is recorded."""
    with seeded.app.catalog.write() as session:
        job = session.get(JobRecord, job_id)
        assert job is not None
        job.status, job.error = status, error


def _verified(at: object) -> str:
    [metric] = [m for m in at.metric if m.label == "Verified"]  # type: ignore[attr-defined]
    return str(metric.value)


def test_the_verdict_is_shown_where_the_test_load_was_started(seeded: Seeded, ort_engine: int) -> None:
    at = engine_view(ort_engine).run()
    assert _verified(at) == "never"
    at.button(key="engines_testload").click().run()
    with seeded.app.catalog.read() as session:
        [job] = session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).all()
    assert any(f"Test-load job {job.id} is queued" in plain(i.value) for i in at.info)

    run = run_test_load(seeded.app, ort_engine, iterations=2, job_id=job.id)
    assert run.verdict == "PASS", run.reason
    _finish(seeded, job.id or 0, JobStatus.SUCCEEDED)
    at.run()
    assert not at.exception, at.exception
    [line] = [t for t in (plain(s.value) for s in at.success) if f"Test-load job {job.id}" in t]
    assert f"Test-load job {job.id} on {run.hostname}: PASS." in line and "load " in line and "p50 " in line
    assert "Test-loads tab" in line
    assert _verified(at) != "never", "a PASS read the blob verified"


def test_a_test_load_job_that_failed_says_why_where_it_was_started(seeded: Seeded, ort_engine: int) -> None:
    at = engine_view(ort_engine).run()
    at.button(key="engines_testload").click().run()
    with seeded.app.catalog.read() as session:
        [job] = session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).all()
    _finish(seeded, job.id or 0, JobStatus.DEAD, "the worker died twice")
    at.run()
    errors = [plain(e.value) for e in at.error]
    assert any(f"Test-load job {job.id} ended DEAD: the worker died twice" in e for e in errors), errors
