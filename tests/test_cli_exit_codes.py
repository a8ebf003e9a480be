"""Exit codes by kind of error (0 ok, 1 failed, 2 bad input, 3 unavailable), a catalog that cannot be
reached, usage errors, the waits of `build`/`test-load` that end before their job does, and the
children of the one-shot worker that runs a job here (forked from a zygote, not a fork server)."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

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
from enginecache.service import testkinds
from enginecache.service import worker as worker_module
from enginecache.service.context import AppContext
from enginecache.service.submitwait import run_and_wait
from enginecache.service.worker import Worker
from enginecache.service.zygote import Zygote
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


def test_a_usage_error_exits_2_with_the_usage_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["engine", "show"], ["model", "list", "--bogus"], ["no-such-command"]):
        result = run_cli(capsys, *args)
        assert result.code == EXIT_BAD_INPUT, (args, result.err)
        assert "Usage:" in result.err and "Traceback" not in result.err


# -- the one-shot worker's children -------------------------------------------------------------

ANY_WORKER = {"backend": "ort"}  # requirements this host meets (ONNX Runtime is a base dependency)


@pytest.fixture
def test_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test-only job kinds (sleep, crash) for the children forked from this process."""
    monkeypatch.setenv(testkinds.ENABLE_ENV, "1")


@pytest.fixture
def zygotes(monkeypatch: pytest.MonkeyPatch) -> list[Zygote]:
    """Every Zygote made during the test, and the pids of the children it forked (`forked`)."""
    made: list[Zygote] = []
    make, fork = Zygote.__init__, Zygote.fork

    def record(self: Zygote, **kwargs: Any) -> None:
        make(self, **kwargs)
        self.forked = []  # type: ignore[attr-defined]
        made.append(self)

    def record_fork(self: Zygote, target: Any, args: tuple[Any, ...]) -> int:
        pid = fork(self, target, args)
        self.forked.append(pid)  # type: ignore[attr-defined]
        return pid

    monkeypatch.setattr(Zygote, "__init__", record)
    monkeypatch.setattr(Zygote, "fork", record_fork)
    return made


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _no_fork_server() -> None:
    raise AssertionError("the one-shot worker started the fork server")


def _stop_tqdm_monitor(monkeypatch: pytest.MonkeyPatch) -> None:
    """Earlier tests in this process ran ModelOpt, whose tqdm leaves a monitor thread behind; a CLI
    process has none. Stop it (and start no new one) so this process is single-threaded again."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is None:
        return
    monkeypatch.setattr(tqdm.tqdm, "monitor_interval", 0)
    monitor = getattr(tqdm.tqdm, "monitor", None)
    if monitor is not None:
        monitor.exit()


@pytest.mark.usefixtures("test_kinds")
def test_a_one_shot_attempt_runs_in_a_fork_of_this_process(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    _stop_tqdm_monitor(monkeypatch)
    assert threading.active_count() == 1, [t.name for t in threading.enumerate()]
    monkeypatch.setattr(worker_module, "_child_context", _no_fork_server)
    job = queue.enqueue(app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER).job
    done = run_and_wait(app_ctx, job, timeout_seconds=60)
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert len(zygotes) == 1 and len(zygotes[0].forked) == 1  # type: ignore[attr-defined]
    assert not _alive(zygotes[0].pid), "the zygote is reaped when the wait ends"


@pytest.mark.usefixtures("test_kinds")
def test_a_one_shot_attempt_that_segfaults_is_a_failed_attempt(app_ctx: AppContext, zygotes: list[Zygote]) -> None:
    job = queue.enqueue(
        app_ctx.catalog, kind="crash", payload={"signal": "SIGSEGV"}, requirements=ANY_WORKER, max_attempts=1
    ).job
    done = run_and_wait(app_ctx, job, timeout_seconds=60)
    assert done.status == JobStatus.DEAD
    assert "SIGSEGV" in (done.error or "")
    assert len(zygotes) == 1


@pytest.mark.usefixtures("test_kinds")
def test_a_timed_out_wait_kills_the_running_attempt_and_hands_the_job_back(
    app_ctx: AppContext, zygotes: list[Zygote]
) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="sleep", payload={"seconds": 60}, requirements=ANY_WORKER).job

    def started() -> bool:
        return bool(zygotes and zygotes[0].forked)  # type: ignore[attr-defined]

    with pytest.raises(JobWaitError, match="this host's worker has stopped, the job is QUEUED"):
        run_and_wait(app_ctx, job, timeout_seconds=3)
    assert started(), "the attempt had started"
    child = zygotes[0].forked[0]  # type: ignore[attr-defined]
    assert not _alive(child) and not _alive(zygotes[0].pid)
    assert queue.get_job(app_ctx.catalog, job.id or 0).status == JobStatus.QUEUED


@pytest.mark.usefixtures("test_kinds")
def test_with_other_threads_running_the_one_shot_worker_uses_the_fork_server(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    started: list[bool] = []
    real = worker_module._child_context

    def fork_server() -> Any:
        started.append(True)
        return real()

    monkeypatch.setattr(worker_module, "_child_context", fork_server)
    release = threading.Event()
    other = threading.Thread(target=release.wait, name="another-thread")
    other.start()
    try:
        job = queue.enqueue(app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER).job
        done = run_and_wait(app_ctx, job, timeout_seconds=120)
    finally:
        release.set()
        other.join()
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert started and not zygotes, "no fork while another thread runs"


def test_the_worker_not_its_fork_server_decides_whether_a_child_may_run_the_test_kinds(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server is one per process and keeps the environment it started under: one started
    by an earlier job without ENGINECACHE_TEST_JOB_KINDS must not make a later worker's test kind
    "unknown" (the order-dependent failure this guards against), nor the reverse."""
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    monkeypatch.setattr(worker_module, "_child_context", lambda: multiprocessing.get_context("forkserver"))
    monkeypatch.delenv(testkinds.ENABLE_ENV, raising=False)
    refused = queue.enqueue(
        app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER, max_attempts=1
    ).job
    Worker(app_ctx, worker_module.WorkerConfig(name="no-test-kinds", job_id=refused.id)).run()
    assert queue.get_job(app_ctx.catalog, refused.id or 0).status in (JobStatus.FAILED, JobStatus.DEAD)
    assert multiprocessing.forkserver._forkserver._forkserver_pid is not None, "the fork server is running"  # type: ignore[attr-defined]

    monkeypatch.setenv(testkinds.ENABLE_ENV, "1")  # the same fork server, started without it
    job = queue.enqueue(app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER).job
    Worker(app_ctx, worker_module.WorkerConfig(name="test-kinds", job_id=job.id)).run()
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.SUCCEEDED, done.error


def _exit_with(code: int) -> None:
    raise SystemExit(code)


def _die_by(signum: int) -> None:
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def test_a_zygote_child_exits_as_a_multiprocessing_child_would() -> None:
    zygote = Zygote()
    try:
        for target, args, code in ((_exit_with, (3,), 3), (_die_by, (signal.SIGSEGV,), -signal.SIGSEGV)):
            child = zygote.Process(target=target, args=args, name="t")
            child.start()
            child.join(30)
            assert child.exitcode == code
        sleeper = zygote.Process(target=time.sleep, args=(60,), name="sleeper")
        sleeper.start()
        assert sleeper.pid is not None
        sleeper.join(0.1)
        assert sleeper.exitcode is None, "still running"
        os.kill(sleeper.pid, signal.SIGKILL)
        sleeper.join()
        assert sleeper.exitcode == -signal.SIGKILL
    finally:
        zygote.close()
    assert not _alive(zygote.pid)


def test_a_zygote_is_never_forked_from_a_process_with_threads() -> None:
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        with pytest.raises(RuntimeError, match="one thread"):
            Zygote()
    finally:
        release.set()
        other.join()


def test_a_job_child_whose_worker_is_already_gone_exits_without_running_the_job(
    app_ctx: AppContext, tmp_path: Path
) -> None:
    """A fork clears the death signal, so a child whose worker (and fork server) died before it asked
    for one again would run on unsupervised: it checks the worker right after asking, and exits."""
    import multiprocessing

    from enginecache.core.fingerprint import host_fingerprint
    from enginecache.service.jobattempt import EXIT_LEASE_LOST, ChildSpec
    from enginecache.service.jobchild import run_child

    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: its pid names no process
    job = queue.enqueue(app_ctx.catalog, kind="sleep", payload={"seconds": 30}, requirements=ANY_WORKER).job
    work = tmp_path / "work"
    work.mkdir()
    spec = ChildSpec(  # a catalog nobody serves: a child that ran the job would fail on it instead
        home=app_ctx.home,
        db_url=NOBODY,
        work_dir=work,
        job_id=job.id or 0,
        token="not-a-lease",
        attempt=1,
        kind="sleep",
        payload=job.payload,
        host=host_fingerprint(),
        test_kinds=True,
        worker_pid=gone.pid,
    )
    child = multiprocessing.get_context("spawn").Process(target=run_child, args=(spec,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == EXIT_LEASE_LOST, "it exited before opening the catalog"
    assert not (work / "child-error.txt").exists() and not list(work.iterdir())
    after = queue.get_job(app_ctx.catalog, job.id or 0)
    assert after.status == JobStatus.QUEUED and after.phase in (None, ""), "the job was never touched"
