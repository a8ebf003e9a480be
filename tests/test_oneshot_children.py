"""The children of the one-shot worker that runs a job here: forked from a zygote, not a fork server
(but for a process with other threads), ended with the wait that started them; a zygote's child
exits as a multiprocessing child would; a job child whose worker is gone runs nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import (
    JobWaitError,
)
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.context import AppContext
from enginecache.service.jobs import worker as worker_module
from enginecache.service.jobs.kinds import JOB_KINDS_ENV
from enginecache.service.jobs.worker import Worker
from enginecache.service.jobs.zygote import Zygote
from tests import jobkinds_for_tests
from tests.nocatalog import NOBODY

ANY_WORKER = {"backend": "ort"}  # requirements this host meets (ONNX Runtime is a base dependency)


@pytest.fixture
def test_kinds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test-only job kinds (sleep, crash) for the workers this process makes."""
    monkeypatch.setenv(JOB_KINDS_ENV, jobkinds_for_tests.ENTRY)


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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_worker_not_its_fork_server_decides_which_added_job_kinds_a_child_runs(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fork server is one per process and keeps the environment it started under: one started
    by an earlier job without ENGINECACHE_JOB_KINDS must not make a later worker's added kind
    "unknown" (the order-dependent failure this guards against), nor the reverse."""
    import multiprocessing.forkserver

    multiprocessing.forkserver._forkserver._stop()  # type: ignore[attr-defined]
    monkeypatch.setattr(worker_module, "_child_context", lambda: multiprocessing.get_context("forkserver"))
    monkeypatch.delenv(JOB_KINDS_ENV, raising=False)
    refused = queue.enqueue(
        app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER, max_attempts=1
    ).job
    Worker(app_ctx, worker_module.WorkerConfig(name="no-test-kinds", job_id=refused.id)).run()
    assert queue.get_job(app_ctx.catalog, refused.id or 0).status in (JobStatus.FAILED, JobStatus.DEAD)
    assert multiprocessing.forkserver._forkserver._forkserver_pid is not None, "the fork server is running"  # type: ignore[attr-defined]

    monkeypatch.setenv(JOB_KINDS_ENV, jobkinds_for_tests.ENTRY)  # the same fork server, started without it
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


@pytest.mark.slow
def test_a_job_child_whose_worker_is_already_gone_exits_without_running_the_job(
    app_ctx: AppContext, tmp_path: Path
) -> None:
    """A fork clears the death signal, so a child whose worker (and fork server) died before it asked
    for one again would run on unsupervised: it checks the worker right after asking, and exits."""
    import multiprocessing

    from enginecache.core.fingerprint import host_fingerprint
    from enginecache.service.jobs.child import EXIT_LEASE_LOST, run_child
    from enginecache.service.jobs.kinds import ChildSpec

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
        job_kinds=(jobkinds_for_tests.ENTRY,),
        worker_pid=gone.pid,
    )
    child = multiprocessing.get_context("spawn").Process(target=run_child, args=(spec,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == EXIT_LEASE_LOST, "it exited before opening the catalog"
    assert not (work / "child-error.txt").exists() and not list(work.iterdir())
    after = queue.get_job(app_ctx.catalog, job.id or 0)
    assert after.status == JobStatus.QUEUED and after.phase in (None, ""), "the job was never touched"
