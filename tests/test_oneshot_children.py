"""The children a worker starts its attempts in: forked from a zygote (but in a process with other
threads), which for the one-shot worker that runs a job here is a fork of the waiting command, ended
with the wait that started it; a zygote's children, any number at once, exit as multiprocessing
children would; a job child whose worker is gone runs nothing; a child runs the job kinds its worker
names, whenever its zygote was made."""

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

from enginecache.core.processes import fork_hazard
from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.errors import (
    JobWaitError,
)
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.context import AppContext
from enginecache.service.jobs import kinds
from enginecache.service.jobs import worker as worker_module
from enginecache.service.jobs.kinds import JOB_KINDS_ENV
from enginecache.service.jobs.worker import Worker
from enginecache.service.jobs.zygote import Zygote
from tests import jobkinds_for_tests
from tests.nocatalog import NOBODY

ANY_WORKER = {"backend": "ort"}  # requirements this host meets (ONNX Runtime is a base dependency)


@pytest.fixture(autouse=True)
def fork_safe_process(request: pytest.FixtureRequest) -> None:
    """These tests fork from this very process. Where an earlier test in it started a client that
    runs threads of its own (the S3 client: `core.processes.fork_hazard`), no fork may be taken here,
    and the test runs in a new pytest process instead; its outcome is this test's (reported as a
    skip that says it passed there)."""
    hazard = fork_hazard()
    if hazard is None:
        return
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", request.node.nodeid],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"in a new process ({hazard} here):\n{done.stdout[-4000:]}"
    pytest.skip(f"passed in a new process: {hazard} in this one, so no fork is taken here")


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
    """Whether `pid` still exists, a zombie too (unlike core.processes.pid_alive): a child not yet
    reaped is alive here."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


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
def test_with_other_threads_running_the_one_shot_worker_spawns_its_attempt(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch, zygotes: list[Zygote]
) -> None:
    started: list[str] = []
    real = worker_module.multiprocessing.get_context

    def context(method: str | None = None) -> Any:
        started.append(str(method))
        return real(method)

    monkeypatch.setattr(worker_module.multiprocessing, "get_context", context)
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
    assert started == ["spawn"] and not zygotes, "no fork while another thread runs"


@pytest.mark.slow
def test_a_child_runs_the_job_kinds_its_worker_names_whenever_its_zygote_was_made(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker names its added kinds to each child (`ChildSpec.job_kinds`): a zygote made before
    they were named (as a one-shot worker's is, or one a caller hands on) has none in its copy of this
    process, and its children run them all the same; a worker that names none finds them unknown."""
    _stop_tqdm_monitor(monkeypatch)
    monkeypatch.setattr(kinds, "JOB_RUNNERS", {})  # what a zygote copies: none added
    monkeypatch.delenv(JOB_KINDS_ENV, raising=False)
    refused = queue.enqueue(
        app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER, max_attempts=1
    ).job
    Worker(app_ctx, worker_module.WorkerConfig(name="no-added-kinds", job_id=refused.id)).run()
    unknown = queue.get_job(app_ctx.catalog, refused.id or 0)
    assert unknown.status == JobStatus.FAILED and unknown.error == "unknown job kind 'sleep'"

    app_ctx.catalog.dispose()
    zygote = Zygote()  # before the kinds are named
    try:
        monkeypatch.setenv(JOB_KINDS_ENV, jobkinds_for_tests.ENTRY)
        job = queue.enqueue(app_ctx.catalog, kind="sleep", payload={"seconds": 0}, requirements=ANY_WORKER).job
        Worker(app_ctx, worker_module.WorkerConfig(name="added-kinds", job_id=job.id), children=zygote).run()
    finally:
        zygote.close()
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


def test_a_zygote_runs_children_at_once_each_joined_from_its_own_thread() -> None:
    """A worker with several slots starts and joins its attempts from as many threads."""
    zygote = Zygote()
    try:
        sleepers = [zygote.Process(target=time.sleep, args=(60,), name=f"s{i}") for i in range(3)]
        for sleeper in sleepers:
            sleeper.start()
        quick = zygote.Process(target=_exit_with, args=(5,), name="quick")
        quick.start()
        codes: dict[str, int | None] = {}

        def join(child: Any) -> None:
            child.join(60)
            codes[child.name] = child.exitcode

        joiners = [threading.Thread(target=join, args=(child,)) for child in (*sleepers, quick)]
        for joiner in joiners:
            joiner.start()
        joiners[-1].join(60)
        assert codes == {"quick": 5}, "the quick child is seen to end while the others run"
        for signum, sleeper in zip((signal.SIGKILL, signal.SIGTERM, signal.SIGUSR1), sleepers, strict=True):
            os.kill(sleeper.pid or 0, signum)
        for joiner in joiners:
            joiner.join(60)
        assert codes == {"s0": -signal.SIGKILL, "s1": -signal.SIGTERM, "s2": -signal.SIGUSR1, "quick": 5}
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
    """A fork clears the death signal, so a child whose worker (and zygote) died before it asked
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
