"""Every view in each state it can be in (issue 12): an empty catalog says what to do next on
every view; a running build and a running test-load show their progress where they appear (the
Build job list and matrix, the Coverage matrix, the engine's page); a finished one shows none.
Failed and done states are covered with each view's own tests (test_dashboard_honest, _live,
_coverage, _testload, _finding)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.db.models import JobRecord, JobStatus, utcnow
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.builds.testload import submit_test_load
from enginecache.service.context import AppContext
from tests.dashboardkit import Seeded, engine_view, frame, plain, serve_home, texts, view

EMPTY = {  # view -> what it says on an empty catalog
    "overview": "No builds in the last 30 days.",
    "models": "No models yet: upload an ONNX file above or register a path on the server.",
    "build": "No models yet: add one under Models first.",
    "coverage": "No models yet: add one under Models, then build it",
    "engines": "No engines yet: build one under Build (or from the Coverage matrix).",
    "timings": "No engines built yet: timings appear once a build is READY.",
    "hosts": "No worker has registered yet",
    "audit": "No change recorded yet.",
}


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    serve_home(tmp_path / "home", monkeypatch)
    AppContext.from_settings(tmp_path / "home").close()


@pytest.mark.parametrize("name", list(EMPTY))
def test_every_view_says_what_to_do_on_an_empty_catalog(empty: None, name: str) -> None:
    at = view(name).run()
    assert not at.exception, at.exception
    assert not at.error, [e.value for e in at.error]
    assert any(EMPTY[name] in str(i.value) for i in at.info), [i.value for i in at.info]


@pytest.mark.slow
def test_an_engines_filter_that_matches_nothing_says_so(seeded: Seeded) -> None:
    at = view("engines").run()
    at.text_input(key="engines_f_search").set_value("no-such-model").run()
    assert any("No engines match: clear a filter" in str(i.value) for i in at.info)


def _running(seeded: Seeded, job_id: int, progress: float, phase: str) -> None:
    with seeded.app.catalog.write() as session:
        job = session.get(JobRecord, job_id)
        assert job is not None
        job.status, job.progress, job.phase, job.started_at, job.lease_owner = (
            JobStatus.RUNNING,
            progress,
            phase,
            utcnow(),
            "worker-a",
        )
        session.add(job)


def _progress(at: AppTest) -> list[str]:
    """The progress bars' texts, as they read (their Markdown escapes removed)."""
    return [plain(p.proto.text) for p in at.get("progress")]


def test_a_running_build_shows_its_progress_in_the_job_list_the_matrix_and_coverage(seeded: Seeded) -> None:
    request = BuildRequest(model=str(seeded.model_id), backend="rtx", targets=("sm89",), precision="fp16")
    job = submit_build(seeded.app, request).job
    assert job is not None
    _running(seeded, job.id or 0, 0.4, "Building engine")

    at = view("build").run()
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm89"]).run()
    at.multiselect(key=f"build_precisions_{seeded.model_id}").set_value(["fp16"]).run()
    assert not at.exception, at.exception
    [bar] = _progress(at)
    assert f"job {job.id}" in bar and "RUNNING · Building engine" in bar
    assert not at.button(key=f"build_cancel_{job.id}").disabled
    matrix = frame(at, "target").set_index("target")
    assert matrix.loc["TensorRT-RTX sm89", "fp16"] == f"running (job {job.id}, Building engine · 40%)"  # as its card
    assert at.button(key="build_submit").disabled, "the only cell is building: nothing to submit"

    cov = AppTest.from_string(
        "import streamlit as st\nfrom enginecache.dashboard.views import coverage\n"
        "st.query_params['backend'] = 'rtx'\nst.query_params['precision'] = 'fp16'\ncoverage.render()\n",
        default_timeout=60,
    ).run()
    cells = frame(cov, "model", "precision").iloc[0].tolist()
    assert f"BUILDING · job {job.id}" in cells
    assert "BUILDING 1" in texts(cov)

    # done: no progress bar, no Cancel
    with seeded.app.catalog.write() as session:
        row = session.get(JobRecord, job.id)
        assert row is not None
        row.status, row.finished_at = JobStatus.SUCCEEDED, utcnow()
        session.add(row)
    at.run()
    assert not _progress(at) and f"build_cancel_{job.id}" not in {b.key for b in at.button}


def test_a_running_test_load_shows_its_progress_on_its_engine(seeded: Seeded) -> None:
    job = submit_test_load(seeded.app, seeded.engine_id)
    _running(seeded, job.id or 0, 0.5, "first inference")
    at = engine_view(seeded.engine_id).run()
    assert not at.exception, at.exception
    assert any(f"test-load job {job.id} RUNNING · first inference" in bar for bar in _progress(at))
    assert not at.warning, "a worker has it: no 'no live worker' warning"
    assert not at.button(key=f"engines_cancel_{job.id}").disabled
