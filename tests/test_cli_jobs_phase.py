"""`jobs` and `job show` name a job's phase only while it is QUEUED or RUNNING: a finished job
(SUCCEEDED, FAILED, DEAD, CANCELLED) keeps its last recorded phase in the catalog (and in `--json`),
but the text views do not show it as if the job were still in it."""

from __future__ import annotations

from typing import Any

import pytest

from enginecache.db import queue
from enginecache.db.models import ACTIVE_JOB_STATUSES, JobStatus
from enginecache.service.context import AppContext
from enginecache.service.readmodels import jobprogress
from tests.clirunner import run_cli


def _always(_requirements: Any) -> bool:
    return True


def _started(app: AppContext, phase: str, *, max_attempts: int = 3) -> tuple[int, str]:
    """A new job, claimed by worker "w" and reporting `phase`: (job id, lease token)."""
    job = queue.enqueue(app.catalog, kind="sleep", payload={"seconds": 1}, requirements={}, max_attempts=max_attempts)
    job_id = job.job.id or 0
    lease = queue.claim(app.catalog, worker="w", can_run=_always, lease_seconds=60, job_id=job_id)
    assert lease is not None
    queue.report_progress(app.catalog, job_id, lease.token, progress=0.5, phase=phase)
    return job_id, lease.token


@pytest.fixture
def jobs_in_every_state(app_ctx: AppContext) -> dict[str, int]:
    """One job per status, each with a phase of its own recorded while it ran: status -> job id."""
    catalog = app_ctx.catalog
    succeeded, token = _started(app_ctx, "sleeping")
    queue.complete(catalog, succeeded, token, status=JobStatus.SUCCEEDED)
    failed, token = _started(app_ctx, "converting")
    queue.complete(catalog, failed, token, status=JobStatus.FAILED, error="no such op")
    dead, token = _started(app_ctx, "compiling", max_attempts=1)
    assert queue.fail_attempt(catalog, dead, token, error="child killed", backoff_seconds=0).status == JobStatus.DEAD
    cancelled, token = _started(app_ctx, "calibrating")
    queue.request_cancel(catalog, cancelled)
    queue.complete(catalog, cancelled, token, status=JobStatus.CANCELLED, error="cancelled")
    running, _ = _started(app_ctx, "deserializing")
    handed_back, token = _started(app_ctx, "parsing")
    assert queue.release(catalog, handed_back, token).status == JobStatus.QUEUED  # its phase: "handed back"
    ids = {
        JobStatus.SUCCEEDED: succeeded,
        JobStatus.FAILED: failed,
        JobStatus.DEAD: dead,
        JobStatus.CANCELLED: cancelled,
        JobStatus.RUNNING: running,
        JobStatus.QUEUED: handed_back,
    }
    for status, job_id in ids.items():
        assert queue.get_job(catalog, job_id).status == status
    return ids


PHASES = {
    JobStatus.SUCCEEDED: "sleeping",
    JobStatus.FAILED: "converting",
    JobStatus.DEAD: "compiling",
    JobStatus.CANCELLED: "calibrating",
    JobStatus.RUNNING: "deserializing",
    JobStatus.QUEUED: "handed back",
}


def test_jobs_shows_a_phase_only_for_an_unfinished_job(
    app_ctx: AppContext, jobs_in_every_state: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(app_ctx.home)]
    listed = run_cli(capsys, *home, "jobs")
    assert listed.code == 0, listed.err
    lines = {int(line.split()[0]): line for line in listed.out.splitlines() if line.strip()}
    assert set(lines) == set(jobs_in_every_state.values()), listed.out
    for status, job_id in jobs_in_every_state.items():
        line = lines[job_id]
        assert status in line, line
        if status in ACTIVE_JOB_STATUSES:
            assert line.rstrip().endswith(PHASES[status]), f"a {status} job shows its phase: {line!r}"
        else:
            assert PHASES[status] not in line, f"a {status} job shows a stale phase: {line!r}"
            assert line.rstrip().endswith(" w"), f"nothing after the worker for a finished job: {line!r}"

    recorded = {row["id"]: row["phase"] for row in run_cli(capsys, *home, "jobs", "--json").json()}
    assert recorded == {job_id: PHASES[status] for status, job_id in jobs_in_every_state.items()}, (
        "--json keeps the phase as recorded"
    )


def test_job_show_names_a_phase_only_for_an_unfinished_job(
    app_ctx: AppContext, jobs_in_every_state: dict[str, int], capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(app_ctx.home)]
    for status, job_id in jobs_in_every_state.items():
        shown = run_cli(capsys, *home, "job", "show", str(job_id))
        assert shown.code == 0, shown.err
        assert shown.out.startswith(f"job {job_id}: sleep {status},"), shown.out
        phase_lines = [line for line in shown.out.splitlines() if line.startswith("phase:")]
        if status in ACTIVE_JOB_STATUSES:
            assert phase_lines == [f"phase: {PHASES[status]}"], shown.out
        else:
            assert phase_lines == [], f"a {status} job shows a stale phase:\n{shown.out}"


def test_the_phase_wording_names_the_unfinished_statuses_as_the_catalog_does() -> None:
    """`service.readmodels.jobprogress` keeps its own names of the active statuses (the CLI's `jobs`
    imports no SQLModel tables to word a phase)."""
    assert tuple(str(s) for s in ACTIVE_JOB_STATUSES) == (jobprogress.QUEUED, jobprogress.RUNNING)
