"""Progress an operator can read (issue 28, finding 12 and point 4): job cards say how long a job has
waited, run or taken; a job whose worker has reported no progress yet (a short build, an ONNX Runtime
build, the seconds after a claim) reads "starting" with no empty bar, never the queue's "claimed";
the card and the Build matrix read one source (`service.readmodels.jobprogress`), so they say the
same words; a view draws under a loading spinner."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from datetime import timedelta

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.dashboard import app as dashboard_app
from enginecache.db.models import JobRecord, JobStatus, utcnow
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.readmodels.jobprogress import job_progress, phase_words, seconds_text
from tests.clirunner import run_cli
from tests.dashboardkit import Seeded, frame, plain, view

T0 = utcnow()


def _job(status: str, *, phase: str | None = None, progress: float = 0.0, **times: float) -> JobRecord:
    """A job row whose timestamps are T0 + the seconds given (created, started, finished)."""
    at = {name: T0 + timedelta(seconds=s) for name, s in times.items()}
    return JobRecord(
        kind="build",
        status=status,
        phase=phase,
        progress=progress,
        created_at=at.get("created", T0),
        started_at=at.get("started"),
        finished_at=at.get("finished"),
    )


def test_a_just_claimed_job_is_starting_with_no_bar_and_its_running_time() -> None:
    shown = job_progress(_job(JobStatus.RUNNING, phase="claimed", started=1.0), T0 + timedelta(seconds=4))
    assert (shown.fraction, shown.words, shown.duration) == (None, "starting", "running for 3.0 s")


def test_progress_reported_under_the_claim_phase_reads_as_a_percentage_not_claimed() -> None:
    shown = job_progress(_job(JobStatus.RUNNING, phase="claimed", progress=0.67, started=0.0), T0)
    assert shown.fraction == pytest.approx(0.67) and shown.words == "67%"


def test_a_phase_and_progress_read_together() -> None:
    shown = job_progress(_job(JobStatus.RUNNING, phase="Building engine", progress=0.4, started=0.0), T0)
    assert shown.words == "Building engine · 40%"


def test_queued_and_finished_jobs_say_how_long() -> None:
    assert job_progress(_job(JobStatus.QUEUED), T0 + timedelta(seconds=4)).duration == "queued for 4.0 s"
    done = _job(JobStatus.SUCCEEDED, started=2.0, finished=9.3)
    assert job_progress(done, T0 + timedelta(hours=1)).duration == "took 7.3 s (queued 2.0 s)"
    quick = _job(JobStatus.FAILED, started=0.2, finished=1.4)
    assert job_progress(quick).duration == "took 1.2 s"
    cancelled = _job(JobStatus.CANCELLED, finished=65.0)
    assert job_progress(cancelled).duration == "ended after 1 min 05 s"


def test_seconds_read_as_people_read_them() -> None:
    assert [seconds_text(s) for s in (0.41, 42.4, 185, 7440)] == ["0.4 s", "42 s", "3 min 05 s", "2 h 04 min"]


def _running(seeded: Seeded, phase: str, progress: float) -> int:
    request = BuildRequest(model=str(seeded.model_id), backend="rtx", targets=("sm89",), precision="fp16")
    submitted = submit_build(seeded.app, request).job
    assert submitted is not None
    with seeded.app.catalog.write() as session:
        job = session.get(JobRecord, submitted.id)
        assert job is not None
        job.status, job.phase, job.progress = JobStatus.RUNNING, phase, progress
        job.started_at, job.lease_owner = utcnow() - timedelta(seconds=3), "worker-a"
        session.add(job)
    return submitted.id or 0


def _build_view(seeded: Seeded) -> AppTest:
    at = view("build").run()
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm89"]).run()
    at.multiselect(key=f"build_precisions_{seeded.model_id}").set_value(["fp16"]).run()
    assert not at.exception, at.exception
    return at


def _card_texts(at: AppTest) -> str:
    parts = [plain(m.value) for m in at.markdown] + [plain(c.value) for c in at.caption]
    return "\n".join(parts + [plain(p.proto.text) for p in at.get("progress")])


def test_a_build_nothing_has_been_reported_for_shows_starting_and_no_empty_bar(seeded: Seeded) -> None:
    job_id = _running(seeded, "claimed", 0.0)
    at = _build_view(seeded)
    assert not at.get("progress"), "no bar at 0 before the worker reported anything"
    cards = _card_texts(at)
    assert f"job {job_id}" in cards and "**RUNNING** · starting" in cards and "claimed" not in cards
    assert "running for " in cards, cards
    matrix = frame(at, "target").set_index("target")
    assert matrix.loc["TensorRT-RTX sm89", "fp16"] == f"running (job {job_id}, starting)"


@pytest.mark.parametrize(
    ("phase", "progress", "words"), [("claimed", 0.67, "67%"), ("Building engine", 0.4, "Building engine · 40%")]
)
def test_the_card_and_the_matrix_say_the_same(seeded: Seeded, phase: str, progress: float, words: str) -> None:
    job_id = _running(seeded, phase, progress)
    at = _build_view(seeded)
    [bar] = at.get("progress")
    assert plain(bar.proto.text).endswith(f"RUNNING · {words}")
    matrix = frame(at, "target").set_index("target")
    assert matrix.loc["TensorRT-RTX sm89", "fp16"] == f"running (job {job_id}, {words})"


def test_a_finished_card_says_how_long_it_took(seeded: Seeded) -> None:
    at = view("build").run()
    with seeded.app.catalog.write() as session:
        job = session.get(JobRecord, seeded.failed_job_id)
        assert job is not None
        job.started_at, job.finished_at = utcnow() - timedelta(seconds=12), utcnow() - timedelta(seconds=5)
        job.created_at = job.started_at
        session.add(job)
    at.run()
    assert "took 7.0 s" in _card_texts(at)


def test_a_view_draws_under_a_loading_spinner(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []

    @contextlib.contextmanager
    def spinner(text: str, **_: object) -> Iterator[None]:
        events.append(f"spinner {text}")
        yield
        events.append("spinner gone")

    monkeypatch.setattr(dashboard_app.st, "spinner", spinner)
    fake = types.SimpleNamespace(render=lambda: events.append("view drawn"))
    monkeypatch.setattr(dashboard_app.importlib, "import_module", lambda _name: fake)
    dashboard_app.view_render("build", "Build")()
    assert events == ["spinner Loading Build…", "view drawn", "spinner gone"]


def test_the_cli_words_a_claimed_job_as_every_view_does(seeded: Seeded, capsys: pytest.CaptureFixture[str]) -> None:
    """`enginecache jobs` and `job show` printed the queue's "claimed" for a job its worker had not
    reported on yet; they read `jobprogress.phase_words` now, as the cards and the matrix do."""
    job_id = _running(seeded, "claimed", 0.0)
    home = ("--home", str(seeded.app.home))
    listed = run_cli(capsys, *home, "jobs")
    line = next(row for row in listed.out.splitlines() if row.strip().startswith(str(job_id)))
    assert line.rstrip().endswith("starting") and "claimed" not in listed.out
    shown = run_cli(capsys, *home, "job", "show", str(job_id))
    assert "phase: starting" in shown.out and "claimed" not in shown.out
    assert phase_words("RUNNING", "Building engine") == "Building engine"
    assert phase_words("READY", "Building engine") is None and phase_words("QUEUED", None) is None
