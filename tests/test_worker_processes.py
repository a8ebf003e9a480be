"""Workers as real processes: crash recovery, cancel, lease takeover after SIGSTOP, clean shutdown,
the attempt's timeout.

The jobs are the test-only kinds of `tests.jobkinds_for_tests` (`sleep`, `crash`): the worker
processes here name them in ENGINECACHE_JOB_KINDS, as any added job kinds are named, and the
queue's and the worker's mechanics need no real build. One test keeps a real build (tiny_llama fp16: ModelOpt
AutoCast, then a TensorRT-RTX build, seconds in the child), where the build is the point: a child
killed mid-build publishes nothing. Sleeps here wait on real processes only; each wait polls for
the state it needs.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from enginecache.db import queue
from enginecache.db.catalog import Catalog
from enginecache.db.models import EngineStatus, JobRecord, JobStatus, utcnow
from enginecache.errors import BuildOptionError
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.engines.records import list_engines
from enginecache.service.jobs import kinds
from enginecache.service.jobs.worker import Worker, WorkerConfig
from enginecache.service.models.register import register_model
from tests import jobkinds_for_tests
from tests.conftest import files_under, shared_model, wait_for

ROOT = Path(__file__).resolve().parents[1]
ANY_WORKER = {"backend": "ort"}  # requirements every worker meets (ONNX Runtime is a base dependency)
TERMINAL = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)


def _cli(app: AppContext, *args: str) -> list[str]:
    return [sys.executable, "-m", "enginecache.cli", "--home", str(app.home), "--db", app.db_url, *args]


def _worker_env(*, test_kinds: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != kinds.JOB_KINDS_ENV}
    return {**env, **jobkinds_for_tests.ENV} if test_kinds else env


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log: Path  # stdout and stderr together

    @property
    def pid(self) -> int:
        return self.process.pid


def _start_worker(app: AppContext, name: str, *extra: str, test_kinds: bool = True) -> WorkerProcess:
    """A worker process whose output goes to a file: its zygote and children inherit it, and a
    pipe they held open would keep a reader waiting after the worker itself has exited."""
    log = app.home.parent / f"{name}.log"
    with open(log, "wb") as sink:
        process = subprocess.Popen(
            _cli(app, "worker", "--name", name, *extra),
            cwd=ROOT,
            stdout=sink,
            stderr=sink,
            env=_worker_env(test_kinds=test_kinds),
        )
    return WorkerProcess(process, log)


def _job(app: AppContext, job_id: int) -> JobRecord:
    return queue.get_job(app.catalog, job_id)


def _enqueue(app: AppContext, kind: str, payload: dict[str, Any], **options: Any) -> int:
    """A test-kind job, straight into the queue."""
    return queue.enqueue(app.catalog, kind=kind, payload=payload, requirements=ANY_WORKER, **options).job.id or 0


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


def _gone(pid: int) -> bool:
    """Whether a process has exited (reaped, or a zombie waiting to be)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def _worker_status(app: AppContext, name: str) -> str | None:
    return next((w.status for w in queue.list_workers(app.catalog) if w.name == name), None)


def _sleeping_child(app: AppContext, job_id: int) -> int:
    """Wait until the job's child runs its sleep (its pid recorded, its first progress written)."""
    wait_for(
        lambda: (job := _job(app, job_id)).runner_pid is not None and job.phase == "sleeping",
        60,
        f"job {job_id} to start sleeping in its child",
    )
    return _job(app, job_id).runner_pid or 0


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


# -- the test kinds themselves ----------------------------------------------------------------


def test_added_job_kinds_are_named_by_the_worker_setting(monkeypatch: pytest.MonkeyPatch, app_ctx: AppContext) -> None:
    monkeypatch.setattr(kinds, "JOB_RUNNERS", {})  # this process's table, as a fresh worker has it
    monkeypatch.delenv(kinds.JOB_KINDS_ENV, raising=False)
    assert WorkerConfig(name="plain").job_kinds == ()
    Worker(app_ctx, WorkerConfig(name="plain"), children=object())
    assert kinds.job_runner("sleep") is None, "not named: unknown"
    monkeypatch.setenv(kinds.JOB_KINDS_ENV, f" {jobkinds_for_tests.ENTRY} ,")
    config = WorkerConfig(name="with-test-kinds")
    assert config.job_kinds == (jobkinds_for_tests.ENTRY,)
    Worker(app_ctx, config, children=object())
    assert {name: kinds.job_runner(name) for name in ("sleep", "crash", "held_build")} == jobkinds_for_tests.JOB_KINDS
    kinds.load_job_kinds(config.job_kinds)  # again (as each child of the worker does): a no-op


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("tests.no_such_module:JOB_KINDS", "names no job kinds"),
        ("tests.jobkinds_for_tests:NO_SUCH", "names no job kinds"),
        ("tests.jobkinds_for_tests", "is not module:attribute"),
        ("tests.jobkinds_for_tests:ENTRY", "is not module:attribute"),
        ("tests.test_worker_processes:PRODUCT_NAME_TAKEN", "is the product's"),
    ],
)
def test_a_worker_whose_added_job_kinds_are_wrong_refuses_to_start(
    monkeypatch: pytest.MonkeyPatch, app_ctx: AppContext, entry: str, says: str
) -> None:
    monkeypatch.setattr(kinds, "JOB_RUNNERS", {})
    with pytest.raises(BuildOptionError, match=f"ENGINECACHE_JOB_KINDS: .*{says}"):
        Worker(app_ctx, WorkerConfig(name="w", job_kinds=(entry,)), children=object())


PRODUCT_NAME_TAKEN = {"build": jobkinds_for_tests.run_sleep}  # a product kind's name: refused


@pytest.mark.slow
def test_a_worker_not_naming_the_test_kinds_finds_them_unknown(app_ctx: AppContext) -> None:
    job_id = _enqueue(app_ctx, "sleep", {"seconds": 0})
    worker = _start_worker(app_ctx, "plain", "--once", test_kinds=False)
    worker.process.wait(timeout=120)
    job = _job(app_ctx, job_id)
    assert job.status == JobStatus.FAILED and job.attempts == 1, (job.status, job.error, worker.log.read_text())
    assert job.error == "unknown job kind 'sleep'"


# -- crashes ----------------------------------------------------------------------------------


def _work_until_done(app: AppContext, job_id: int, what: str) -> tuple[JobRecord, str]:
    """Worker "w1" runs until job `job_id` ends (120 s at most): the job and the worker's log."""
    worker = _start_worker(app, "w1")
    try:
        wait_for(lambda: _job(app, job_id).status in TERMINAL, 120, what)
    finally:
        log = _stop(worker)
    return _job(app, job_id), log


@pytest.mark.slow
@pytest.mark.parametrize("crash", [signal.SIGKILL, signal.SIGSEGV], ids=["sigkill", "segfault"])
def test_crashed_child_counts_an_attempt_cleans_up_and_the_retry_succeeds(
    catalog_ctx: AppContext, crash: signal.Signals
) -> None:
    app = catalog_ctx
    job_id = _enqueue(app, "crash", {"signal": crash.name, "attempts": 1})
    job, log = _work_until_done(app, job_id, "the retry")
    assert job.status == JobStatus.SUCCEEDED and job.attempts == 2, (job.status, job.error, log)
    assert job.lease_owner == "w1" and job.lease_token is None and job.runner_pid is None
    assert f"job {job_id} attempt 1 failed (child killed by {crash.name}): now QUEUED" in log
    assert files_under(app.home / "tmp") == [], "the crashed attempt's working directory is gone"


@pytest.mark.slow
def test_child_crashing_on_every_attempt_ends_dead_naming_the_signal(app_ctx: AppContext) -> None:
    job_id = _enqueue(app_ctx, "crash", {"signal": "SIGSEGV"}, max_attempts=2)
    job, log = _work_until_done(app_ctx, job_id, "the last attempt")
    assert job.status == JobStatus.DEAD and job.attempts == 2, (job.status, job.error, log)
    assert job.error == "attempt 2 of 2 failed: child killed by SIGSEGV"


@pytest.mark.shared
def test_real_build_killed_midway_publishes_nothing_and_the_retry_does(app_ctx: AppContext) -> None:
    """The child dies while its engine row is PENDING (converting tiny_llama takes seconds)."""
    app = app_ctx
    register_model(app, shared_model("tiny_llama.onnx"), name="tiny_llama")
    request = BuildRequest(model="tiny_llama", backend="rtx", targets=("sm89",), precision="fp16")
    job_id = submit_build(app, request).job.id or 0  # type: ignore[union-attr]
    worker = _start_worker(app, "w1", test_kinds=False)
    try:
        wait_for(
            lambda: (
                _job(app, job_id).runner_pid is not None
                and any(e.job_attempt == 1 and e.status == EngineStatus.PENDING for e in list_engines(app))
            ),
            60,
            "the first attempt's child and its engine row",
        )
        child = _job(app, job_id).runner_pid or 0
        assert child > 0
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: _job(app, job_id).status in TERMINAL, 180, "the retry")
    finally:
        log = _stop(worker)
    job = _job(app, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.attempts == 2, (job.error, log)
    engines = list_engines(app)
    [first] = [e for e in engines if e.job_attempt == 1]
    assert first.status == EngineStatus.FAILED and "SIGKILL" in (first.error or "")
    ready = [e for e in engines if e.status == EngineStatus.READY]
    assert [(e.id, e.job_attempt) for e in ready] == [(job.result_engine_id, 2)]
    assert files_under(app.home / "tmp") == [], "the killed attempt's files are gone"
    digest = ready[0].sha256 or ""
    assert files_under(app.home / "objects") == [Path("sha256", digest[:2], digest)], "no half-written blob"


# -- cancel, lease takeover -------------------------------------------------------------------


@pytest.mark.slow
def test_cancel_running_job_kills_the_child_and_never_retries(app_ctx: AppContext) -> None:
    app = app_ctx
    job_id = _enqueue(app, "sleep", {"seconds": 60})
    worker = _start_worker(app, "w1")
    try:
        child = _sleeping_child(app, job_id)
        out = subprocess.run(
            _cli(app, "job", "cancel", str(job_id), "--json"), cwd=ROOT, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["cancel_requested"] is True
        wait_for(lambda: _job(app, job_id).status == JobStatus.CANCELLED, 30, "the cancel")
        wait_for(lambda: _gone(child), 10, "the child to die")
    finally:
        _stop(worker)  # the worker is gone: nothing can claim the job after this
    job = _job(app, job_id)
    assert job.status == JobStatus.CANCELLED and job.attempts == 1
    assert job.error == "cancelled while running"
    assert files_under(app.home / "tmp") == []


@pytest.mark.slow
def test_stopped_worker_loses_its_lease_and_its_late_writes_are_rejected(app_ctx: AppContext) -> None:
    app = app_ctx
    job_id = _enqueue(app, "sleep", {"seconds": 4})
    stalled = _start_worker(app, "stalled", "--lease-seconds", "2")
    child = 0
    try:
        child = _sleeping_child(app, job_id)
        _stop_outside_transactions(app, [child, stalled.pid])
        wait_for(lambda: (_job(app, job_id).lease_expires_at or utcnow()) < utcnow(), 30, "the 2 s lease to expire")
        taker = _start_worker(app, "taker", "--once")
        assert taker.process.wait(timeout=120) == 0, taker.log.read_text()
        taken = _job(app, job_id)
        assert taken.status == JobStatus.SUCCEEDED and taken.attempts == 2 and taken.lease_owner == "taker"
        for pid in (child, stalled.pid):
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: _gone(child), 60, "the stale child to end")
    finally:
        for pid in (child, stalled.pid):
            if pid and not _gone(pid):
                os.kill(pid, signal.SIGCONT)
        stalled_log = _stop(stalled)
    assert "stale" in stalled_log
    after = _job(app, job_id)
    fields = ("status", "attempts", "lease_owner", "progress", "phase", "log_tail", "finished_at", "updated_at")
    assert {f: getattr(after, f) for f in fields} == {f: getattr(taken, f) for f in fields}, "no late write landed"


# -- shutdown ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_worker_exits_cleanly_on_sigterm_and_goes_offline(app_ctx: AppContext) -> None:
    app = app_ctx
    worker = _start_worker(app, "idle")
    try:
        wait_for(lambda: any(w.name == "idle" for w in queue.list_workers(app.catalog)), 30, "registration")
    finally:
        worker.process.send_signal(signal.SIGTERM)
        worker.process.wait(timeout=30)
    assert worker.process.returncode == 0
    [record] = queue.list_workers(app.catalog)
    assert record.status == "offline"
    assert record.capabilities["backends"] and "rtx" in record.capabilities["backends"]
    assert record.fingerprint["cpu_model"]


@pytest.mark.slow
def test_sigterm_lets_the_running_job_finish_then_exits(app_ctx: AppContext) -> None:
    app = app_ctx
    job_id = _enqueue(app, "sleep", {"seconds": 4})
    worker = _start_worker(app, "graceful")
    _sleeping_child(app, job_id)
    signalled_at = utcnow()
    worker.process.send_signal(signal.SIGTERM)
    wait_for(lambda: _worker_status(app, "graceful") == "stopping", 30, "the worker to say it is stopping")
    assert worker.process.wait(timeout=120) == 0, worker.log.read_text()
    assert _worker_status(app, "graceful") == "offline"
    job = _job(app, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.attempts == 1, (job.status, job.error)
    assert job.finished_at is not None and job.finished_at > signalled_at, "it finished after the SIGTERM"


@pytest.mark.slow
def test_second_sigterm_hands_the_job_back(app_ctx: AppContext) -> None:
    app = app_ctx
    job_id = _enqueue(app, "sleep", {"seconds": 60})
    worker = _start_worker(app, "impatient")
    child = _sleeping_child(app, job_id)
    worker.process.send_signal(signal.SIGTERM)
    wait_for(lambda: _worker_status(app, "impatient") == "stopping", 30, "the worker to take the first SIGTERM")
    assert _job(app, job_id).status == JobStatus.RUNNING, "a stopping worker lets its job run"
    worker.process.send_signal(signal.SIGTERM)
    assert worker.process.wait(timeout=60) == 0, worker.log.read_text()
    job = _job(app, job_id)
    assert job.status == JobStatus.QUEUED and job.attempts == 0 and job.phase == "handed back"
    assert job.lease_token is None and job.runner_pid is None
    assert _gone(child)
    assert files_under(app.home / "tmp") == []


# -- the attempt's timeout --------------------------------------------------------------------


def run_worker_whose_first_write_waits(home: str, db_url: str, job_id: str, report: str) -> None:
    """Run in a worker subprocess by the test below: a one-job worker whose first write after the
    claim (recording the child's pid) waits the way a write waits on SQLite's busy timeout, until
    the child is gone or 20 s passed; `report` says which (JSON)."""
    real_set_runner = queue.set_runner

    def waiting_set_runner(catalog: Catalog, job: int, token: str, pid: int, **kwargs: Any) -> None:
        started = time.monotonic()
        while not _gone(pid) and time.monotonic() - started < 20:
            time.sleep(0.05)
        Path(report).write_text(json.dumps({"child_gone": _gone(pid), "waited_s": time.monotonic() - started}))
        real_set_runner(catalog, job, token, pid, **kwargs)

    queue.set_runner = waiting_set_runner  # type: ignore[assignment]  # the worker calls it as queue.set_runner
    app = AppContext.from_settings(Path(home), db_url)
    try:
        Worker(app, WorkerConfig(name="slow-writes", job_id=int(job_id))).run()  # its zygote warm before the claim
    finally:
        app.close()


@pytest.mark.slow
@pytest.mark.parametrize("seconds", [60, 3], ids=["sleep-60s", "sleep-3s-done-before-the-write"])
def test_timeout_kills_the_attempt_even_while_a_catalog_write_waits(
    app_ctx: AppContext, tmp_path: Path, seconds: int
) -> None:
    """A sleep under a 1 s timeout ends DEAD, never SUCCEEDED: the deadline counts from the claim
    and is enforced while the supervising thread is still stuck in its write. (Counted from after
    that write, the 60 s sleep outlives its deadline; the 3 s one finishes and records SUCCEEDED.)"""
    app = app_ctx
    job_id = _enqueue(app, "sleep", {"seconds": seconds}, max_attempts=1, timeout_seconds=1)
    report = tmp_path / "first-write.json"
    code = f"import sys; from {__name__} import run_worker_whose_first_write_waits as run; run(*sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", code, str(app.home), app.db_url, str(job_id), str(report)],
        cwd=ROOT,
        env=_worker_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    dead = _job(app, job_id)
    assert dead.status == JobStatus.DEAD and dead.attempts == 1, (dead.status, dead.error, done.stderr)
    assert dead.error == "attempt 1 of 1 failed: timed out after 1 s"
    first_write = json.loads(report.read_text())
    assert first_write["child_gone"], f"the child outlived its deadline while the write waited: {first_write}"
    assert dead.started_at is not None and dead.finished_at is not None
    assert dead.finished_at - dead.started_at < timedelta(seconds=20)
    assert files_under(app.home / "tmp") == []


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.05, 0.3], ids=["as-the-child-starts", "just-after"])
def test_sigterm_to_the_workers_process_group_early_in_an_attempt_lets_it_finish(
    app_ctx: AppContext, after: float
) -> None:
    """A service manager or a terminal signals the whole group (systemd's control group, ^C): the
    zygote and a child still starting get the SIGTERM too. The attempt must finish and count once,
    as a SIGTERM to the worker alone lets it; before, the job was left RUNNING by an exited worker."""
    app = app_ctx
    job_id = _enqueue(app, "sleep", {"seconds": 2})
    log = app.home.parent / "group.log"
    with open(log, "wb") as sink:
        worker = subprocess.Popen(
            _cli(app, "worker", "--name", "group"),
            cwd=ROOT,
            stdout=sink,
            stderr=sink,
            env=_worker_env(),
            start_new_session=True,  # its own group, so the signal reaches it and its descendants only
        )
    wait_for(lambda: _job(app, job_id).status == JobStatus.RUNNING, 60, f"job {job_id} claimed")
    time.sleep(after)  # a point inside the attempt's start, not a margin: the outcome must not depend on it
    os.killpg(worker.pid, signal.SIGTERM)
    assert worker.wait(timeout=120) == 0, log.read_text()
    job = _job(app, job_id)
    assert job.status == JobStatus.SUCCEEDED and job.attempts == 1, (job.status, job.attempts, job.error)
