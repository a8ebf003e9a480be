"""`enginecache gc` on abandoned PENDING engine rows: those no build will finish become FAILED
with the reason, once; their build folders are no one's then.

Ages come from the injected clock and from file times set in the past: nothing sleeps."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlmodel import select

from enginecache.db.models import EngineRecord, EngineStatus, JobStatus
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.models.register import register_model
from tests.conftest import FakeClock
from tests.gckit import HOUR, add_engine_row, add_job_row, removed_paths, run_gc, set_age
from tests.modelfactory import make_mlp


def test_abandoned_pending_engines_are_marked_failed_with_the_reason(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app, clock = catalog_ctx, FakeClock()
    model_id = register_model(app, make_mlp(tmp_path / "m.onnx"), name="m").model.id or 0
    dead_job, live_job, queued_job = (
        add_job_row(app, JobStatus.DEAD, 3),
        add_job_row(app, JobStatus.RUNNING, 2),
        add_job_row(app, JobStatus.QUEUED, 1),
    )
    abandoned = {
        add_engine_row(app, model_id, job_id=dead_job, job_attempt=3): f"its job {dead_job} is DEAD",
        add_engine_row(app, model_id, job_id=987654, job_attempt=1): "its job 987654 is gone",
        add_engine_row(app, model_id, job_id=live_job, job_attempt=1): "running attempt 2",
        add_engine_row(app, model_id, job_id=queued_job, job_attempt=1): "attempt 1 of job",
        add_engine_row(app, model_id, created_at=clock.now - timedelta(hours=25)): "no job builds it",
    }
    live = {
        add_engine_row(app, model_id, job_id=live_job, job_attempt=2),
        add_engine_row(app, model_id, created_at=clock.now - timedelta(hours=1)),
    }
    tmp = app.store.tmp_dir
    tmp.mkdir(parents=True, exist_ok=True)
    abandoned_build, live_build = tmp / f"build-{min(abandoned)}-a", tmp / f"build-{min(live)}-b"
    for folder in (abandoned_build, live_build):
        folder.mkdir()
        set_age(folder, 2 * HOUR)

    def statuses() -> dict[int, str]:
        with app.catalog.read() as session:
            return {r.id or 0: r.status for r in session.exec(select(EngineRecord)).all()}

    dry = run_gc(app, clock, apply=False)
    assert {a.engine_id for a in dry.abandoned} == set(abandoned)
    assert set(statuses().values()) == {EngineStatus.PENDING}  # a dry run writes nothing

    report = run_gc(app, clock, apply=True)
    assert {a.engine_id for a in report.abandoned} == set(abandoned)
    now = statuses()
    assert {i for i, s in now.items() if s == EngineStatus.FAILED} == set(abandoned)
    assert {i for i, s in now.items() if s == EngineStatus.PENDING} == live
    for engine_id, words in abandoned.items():
        row = get_engine(app, engine_id)
        assert row.error is not None and row.error.startswith("abandoned (found by gc)") and words in row.error
        assert row.finished_at == clock.now
    assert removed_paths(report, "temp") == {app.store.relative(abandoned_build)}  # its build folder is no one's now
    assert live_build.is_dir()
    assert run_gc(app, clock, apply=True).abandoned == []  # marked once
