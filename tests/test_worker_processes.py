"""Workers as real processes: crash recovery, cancel, lease takeover after SIGSTOP, clean shutdown.

The slow job is a real one: tiny_llama fp16 (ModelOpt AutoCast conversion, then a TensorRT-RTX
build) takes several seconds in the child, long enough to interfere with it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from enginecache.db import queue
from enginecache.db.models import EngineStatus, JobRecord, JobStatus
from enginecache.service.builds import BuildRequest
from enginecache.service.context import AppContext
from enginecache.service.engines import list_engines
from enginecache.service.jobs import submit_build
from enginecache.service.models import register_model
from tests.conftest import shared_model

ROOT = Path(__file__).resolve().parents[1]


def _cli(app: AppContext, *args: str) -> list[str]:
    return [sys.executable, "-m", "enginecache.cli", "--home", str(app.home), "--db", app.db_url, *args]


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log: Path  # stdout and stderr together

    @property
    def pid(self) -> int:
        return self.process.pid


def _start_worker(app: AppContext, name: str, *extra: str) -> WorkerProcess:
    """A worker process whose output goes to a file: its fork server and children inherit it, and a
    pipe they held open would keep a reader waiting after the worker itself has exited."""
    log = app.home.parent / f"{name}.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(_cli(app, "worker", "--name", name, *extra), cwd=ROOT, stdout=sink, stderr=sink)
    return WorkerProcess(process, log)


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _job(app: AppContext, job_id: int) -> JobRecord:
    return queue.get_job(app.catalog, job_id)


def _stop(worker: WorkerProcess) -> str:
    """SIGTERM the worker, wait for it (SIGKILL after 60 s) and return what it wrote."""
    if worker.process.poll() is None:
        worker.process.send_signal(signal.SIGTERM)
    try:
        worker.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.process.kill()
        worker.process.wait()
    return worker.log.read_text()


def _catalog_writable(app: AppContext) -> bool:
    """Whether a write transaction can start now (no stopped process holds SQLite's write lock)."""
    import sqlite3

    connection = sqlite3.connect(app.home / "catalog.db", timeout=0.2, isolation_level=None)
    try:
        connection.execute("BEGIN IMMEDIATE")
        connection.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        connection.close()


def _stop_outside_transactions(app: AppContext, pids: list[int]) -> None:
    """SIGSTOP these processes at a moment none of them holds the catalog's write lock: SQLite has
    one writer at a time, so a process frozen inside a write transaction would block every other
    worker (that is the catalog's nature, not the queue's; PostgreSQL locks only the rows)."""
    for _ in range(100):
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        if _catalog_writable(app):
            return
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.05)
    raise AssertionError("could not stop the worker outside a write transaction")


@pytest.fixture
def slow_app(tmp_path: Path) -> Iterator[AppContext]:
    app = AppContext.from_settings(tmp_path / "home")
    register_model(app, shared_model("tiny_llama.onnx"), name="tiny_llama")
    yield app
    app.close()


@pytest.fixture
def slow_app_any_db(catalog_ctx: AppContext) -> AppContext:
    """The slow job on each catalog database (SQLite, then PostgreSQL)."""
    register_model(catalog_ctx, shared_model("tiny_llama.onnx"), name="tiny_llama")
    return catalog_ctx


SLOW = BuildRequest(model="tiny_llama", backend="rtx", targets=("sm89",), precision="fp16")


def _running_child(app: AppContext, job_id: int) -> int:
    _wait(lambda: _job(app, job_id).runner_pid is not None, 60, f"job {job_id} to start its child")
    return _job(app, job_id).runner_pid or 0


@pytest.mark.parametrize("crash", [signal.SIGKILL, signal.SIGSEGV], ids=["sigkill", "segfault"])
def test_crashed_child_counts_an_attempt_cleans_up_and_the_retry_succeeds(
    slow_app_any_db: AppContext, crash: signal.Signals
) -> None:
    app = slow_app_any_db
    job_id = submit_build(app, SLOW).job.id or 0  # type: ignore[union-attr]
    worker = _start_worker(app, "w1", "--lease-seconds", "6")
    try:
        child = _running_child(app, job_id)
        time.sleep(1.0)
        os.kill(child, crash)
        _wait(lambda: _job(app, job_id).status in (JobStatus.SUCCEEDED, JobStatus.DEAD), 120, "the retry")
    finally:
        err = _stop(worker)
    job = _job(app, job_id)
    assert job.status == JobStatus.SUCCEEDED, (job.error, err)
    assert job.attempts == 2
    engines = list_engines(app)
    ready = [e for e in engines if e.status == EngineStatus.READY]
    assert len(ready) == 1 and ready[0].id == job.result_engine_id and ready[0].job_attempt == 2
    for engine in engines:
        if engine.job_attempt == 1:
            assert engine.status == EngineStatus.FAILED and crash.name in (engine.error or "")
    assert list((app.home / "tmp").iterdir()) == [], "the killed attempt's files are gone"
    objects = [p for p in (app.home / "objects").rglob("*") if p.is_file()]
    assert [p.name for p in objects] == [ready[0].sha256], "no half-written blob"


def test_cancel_running_job_kills_the_child_and_never_retries(slow_app: AppContext, tmp_path: Path) -> None:
    app = slow_app
    job_id = submit_build(app, SLOW).job.id or 0  # type: ignore[union-attr]
    worker = _start_worker(app, "w1")
    try:
        child = _running_child(app, job_id)
        out = subprocess.run(
            _cli(app, "job", "cancel", str(job_id), "--json"), cwd=ROOT, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["cancel_requested"] is True
        _wait(lambda: _job(app, job_id).status == JobStatus.CANCELLED, 30, "the cancel")
        _wait(lambda: not Path(f"/proc/{child}").exists() or _is_zombie(child), 10, "the child to die")
        time.sleep(1.0)
    finally:
        _stop(worker)
    job = _job(app, job_id)
    assert job.status == JobStatus.CANCELLED and job.attempts == 1
    assert [e.status for e in list_engines(app)] in ([], [EngineStatus.FAILED])
    assert list((app.home / "tmp").iterdir()) == []


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_stopped_worker_loses_its_lease_and_its_late_writes_are_rejected(slow_app: AppContext) -> None:
    app = slow_app
    job_id = submit_build(app, SLOW).job.id or 0  # type: ignore[union-attr]
    stalled = _start_worker(app, "stalled", "--lease-seconds", "2")
    taker: WorkerProcess | None = None
    child = 0
    try:
        child = _running_child(app, job_id)
        # Wait until the child converts the model (seconds of CPU work, no catalog writes).
        _wait(lambda: any(e.job_attempt == 1 for e in list_engines(app)), 60, "the child to start its build")
        _stop_outside_transactions(app, [child, stalled.pid])
        time.sleep(3.0)  # past the 2 s lease
        taker = _start_worker(app, "taker", "--once")
        _wait(lambda: _job(app, job_id).status == JobStatus.SUCCEEDED, 120, "the takeover to finish")
        taken = _job(app, job_id)
        assert taken.attempts == 2
        for pid in (child, stalled.pid):
            os.kill(pid, signal.SIGCONT)
        _wait(lambda: not Path(f"/proc/{child}").exists() or _is_zombie(child), 60, "the stale child to end")
    finally:
        for pid in (child, stalled.pid):
            if pid and Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGCONT)
        stalled_err = _stop(stalled)
        if taker is not None:
            _stop(taker)
    job = _job(app, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.result_engine_id == taken.result_engine_id
    assert "stale" in stalled_err
    engines = list_engines(app)
    ready = [e for e in engines if e.status == EngineStatus.READY]
    assert [e.id for e in ready] == [job.result_engine_id], "the stale holder published nothing"
    assert ready[0].job_attempt == 2
    assert all(e.status == EngineStatus.FAILED for e in engines if e.job_attempt == 1)


def test_worker_exits_cleanly_on_sigterm_and_goes_offline(tmp_path: Path) -> None:
    app = AppContext.from_settings(tmp_path / "home")
    worker = _start_worker(app, "idle")
    try:
        _wait(lambda: any(w.name == "idle" for w in queue.list_workers(app.catalog)), 30, "registration")
    finally:
        worker.process.send_signal(signal.SIGTERM)
        worker.process.wait(timeout=30)
    assert worker.process.returncode == 0
    [record] = queue.list_workers(app.catalog)
    assert record.status == "offline"
    assert record.capabilities["backends"] and "rtx" in record.capabilities["backends"]
    assert record.fingerprint["cpu_model"]
    app.close()


def test_sigterm_lets_the_running_job_finish_then_exits(slow_app: AppContext) -> None:
    app = slow_app
    job_id = submit_build(app, SLOW).job.id or 0  # type: ignore[union-attr]
    worker = _start_worker(app, "graceful")
    _running_child(app, job_id)
    worker.process.send_signal(signal.SIGTERM)
    worker.process.wait(timeout=120)
    assert worker.process.returncode == 0
    job = _job(app, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.attempts == 1, (job.status, job.error)


def test_second_sigterm_hands_the_job_back(slow_app: AppContext) -> None:
    app = slow_app
    job_id = submit_build(app, SLOW).job.id or 0  # type: ignore[union-attr]
    worker = _start_worker(app, "impatient")
    child = _running_child(app, job_id)
    worker.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    worker.process.send_signal(signal.SIGTERM)
    worker.process.wait(timeout=60)
    assert worker.process.returncode == 0
    job = _job(app, job_id)
    assert job.status == JobStatus.QUEUED and job.attempts == 0 and job.phase == "handed back"
    assert not Path(f"/proc/{child}").exists() or _is_zombie(child)
    assert [e.status for e in list_engines(app)] in ([], [EngineStatus.FAILED])
    assert list((app.home / "tmp").iterdir()) == []


def test_job_past_its_timeout_is_killed_and_dead_on_its_last_attempt(slow_app: AppContext) -> None:
    from enginecache.service.worker import Worker, WorkerConfig

    app = slow_app
    job = submit_build(app, SLOW, max_attempts=1, timeout_seconds=1.5).job
    assert job is not None
    Worker(app, WorkerConfig(name="impatient", job_id=job.id)).run()
    dead = _job(app, job.id or 0)
    assert dead.status == JobStatus.DEAD and dead.attempts == 1
    assert "timed out after 1.5 s" in (dead.error or "")
    assert list((app.home / "tmp").iterdir()) == []
