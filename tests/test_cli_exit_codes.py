"""Exit codes by kind of error (0 ok, 1 failed, 2 bad input, 3 unavailable), a catalog that cannot be
reached, and the waits of `build`/`test-load` that end before their job does."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from enginecache.db import catalog as catalog_module
from enginecache.db import queue
from enginecache.db.catalog import Catalog
from enginecache.db.models import JobStatus
from enginecache.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    BuildFailedError,
    CatalogUnavailableError,
    EngineCacheError,
    InvalidModelError,
    JobWaitError,
    NotFoundError,
    StoreError,
    exit_code_for,
)
from enginecache.service.context import AppContext
from enginecache.service.submitwait import run_and_wait
from enginecache.service.worker import Worker
from tests.clirunner import run_cli

NOBODY = "postgresql://postgres:hunter2@127.0.0.1:1/nope"  # nothing listens on port 1


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (EngineCacheError("x"), EXIT_FAILED),
        (BuildFailedError("x"), EXIT_FAILED),
        (JobWaitError("x", job_id=1, waited_for="y"), EXIT_FAILED),
        (InvalidModelError("x"), EXIT_BAD_INPUT),
        (NotFoundError("x"), EXIT_BAD_INPUT),
        (CatalogUnavailableError("x"), EXIT_UNAVAILABLE),
        (StoreError("x"), EXIT_UNAVAILABLE),
        (ValueError("x"), EXIT_FAILED),
    ],
)
def test_exit_code_per_kind(error: BaseException, code: int) -> None:
    assert exit_code_for(error) == code


def test_catalog_outage_exits_3_naming_the_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(capsys, "--home", str(tmp_path / "home"), "--db", NOBODY, "model", "list")
    assert result.code == EXIT_UNAVAILABLE, (result.out, result.err)
    assert result.err.startswith(
        "error: cannot reach the catalog at postgresql+psycopg://postgres:***@127.0.0.1:1/nope"
    )
    assert "Connection refused" in result.err
    assert "hunter2" not in result.err and "Traceback" not in result.err
    assert result.out == ""


def test_catalog_outage_exit_code_of_the_real_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "enginecache.cli", "--home", str(tmp_path / "home"), "--db", NOBODY, "model", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.startswith("error: cannot reach the catalog at ") and "Traceback" not in done.stderr


def test_sqlite_catalog_that_cannot_be_opened_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-dir' / 'catalog.db'}"
    result = run_cli(capsys, "--home", str(tmp_path / "home"), "--db", url, "jobs")
    assert result.code == EXIT_UNAVAILABLE, result.err
    assert "cannot reach the catalog at sqlite:///" in result.err and "unable to open database file" in result.err


@pytest.mark.parametrize("session", ["read", "write"])
def test_connect_failure_in_a_session_is_unavailable_and_still_an_operational_error(session: str) -> None:
    """The worker rides out an unreachable catalog by catching OperationalError: it still can."""
    catalog = Catalog(NOBODY, migrate=False)
    try:
        with pytest.raises(CatalogUnavailableError) as caught, getattr(catalog, session)():
            pytest.fail("the session connected")
    finally:
        catalog.dispose()
    assert isinstance(caught.value, sa.exc.OperationalError)
    assert caught.value.orig is not None
    assert exit_code_for(caught.value) == EXIT_UNAVAILABLE
    assert "127.0.0.1:1" in str(caught.value) and "hunter2" not in str(caught.value)


def test_sqlite_busy_is_not_unavailable(app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """'database is locked' is contention the worker rides out, not an outage: it passes through as it is."""
    app_ctx.catalog  # noqa: B018 - create and migrate
    holder = sqlite3.connect(app_ctx.home / "catalog.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(catalog_module, "SQLITE_BUSY_TIMEOUT_MS", 100)
    contender = Catalog(app_ctx.db_url, migrate=False)
    try:
        with pytest.raises(sa.exc.OperationalError, match="locked") as caught, contender.write():
            pytest.fail("the write lock was free")
        assert not isinstance(caught.value, CatalogUnavailableError)
        with contender.read() as session:  # readers are not blocked (WAL)
            session.exec(sa.text("SELECT 1"))  # type: ignore[call-overload]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        contender.dispose()


# -- waits that end before the job --------------------------------------------------------------


def _live_worker_elsewhere(app: AppContext) -> None:
    queue.register_worker(
        app.catalog, name="elsewhere", hostname="elsewhere", pid=1, fingerprint={}, capabilities={"backends": ["rtx"]}
    )


def test_wait_timeout_names_the_job_and_what_it_waits_for(app_ctx: AppContext) -> None:
    _live_worker_elsewhere(app_ctx)  # a live worker can run it: nothing starts here
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "rtx"}).job
    with pytest.raises(JobWaitError) as caught:
        run_and_wait(app_ctx, job, timeout_seconds=0.3, poll_seconds=0.05)
    err = caught.value
    assert err.timed_out and err.seconds == 0.3 and err.job_id == job.id
    assert str(err).startswith(f"gave up waiting for job {job.id} after 0.3 s: it is QUEUED")
    assert "a live worker can run it" in err.waited_for
    assert exit_code_for(err) == EXIT_FAILED
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.QUEUED, "left as it is"


def test_a_job_nobody_can_run_is_refused_and_cancelled(app_ctx: AppContext) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "none-such"}).job
    with pytest.raises(JobWaitError, match=rf"no worker can run build job {job.id}: it needs a worker with none-such"):
        run_and_wait(app_ctx, job)
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.CANCELLED


def test_wait_timeout_stops_this_hosts_worker_and_leaves_the_job_queued(app_ctx: AppContext) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "rtx"}).job
    with pytest.raises(JobWaitError, match="this host's worker has stopped, the job is QUEUED") as caught:
        run_and_wait(app_ctx, job, timeout_seconds=0.0)
    assert caught.value.timed_out
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.QUEUED
    assert not [t for t in threading.enumerate() if t.name.startswith("enginecache-oneshot-job-")]


def test_a_failed_local_worker_ends_the_wait_with_its_error(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(_self: Worker) -> int:
        raise RuntimeError("claim exploded")

    monkeypatch.setattr(Worker, "run", broken)
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "rtx"}).job
    with pytest.raises(JobWaitError, match=r"worker for job \d+ stopped before the job finished \(RuntimeError: claim"):
        run_and_wait(app_ctx, job, timeout_seconds=60, poll_seconds=0.05)
