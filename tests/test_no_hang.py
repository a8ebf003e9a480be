"""No command waits forever: worker liveness is a lease its process renews while it runs and that
ends with it, and a one-shot CLI worker (it claims only its own job) is no worker for any other job.

Real processes on SQLite and PostgreSQL: concurrent plain builds with no worker running all finish;
a waiter killed with SIGKILL leaves no row counted as live once its lease is past, and its job is
taken over by the next waiter; a waiter whose capable worker goes away runs the job itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.db import queue
from enginecache.db.models import JobRecord, JobStatus
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import capable_workers, live_workers, submit_build
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.context import AppContext
from enginecache.service.jobs.routing import WORKER_ALIVE_SECONDS, takes_queued_jobs, worker_capabilities
from enginecache.service.models.register import register_model
from tests import jobkinds_for_tests
from tests.conftest import FakeClock, wait_for
from tests.modelfactory import make_mlp

ROOT = Path(__file__).resolve().parents[1]
BOUND = 300  # seconds: generous; a hang shows as running past it
CONCURRENT_BUILDS = 8

# What `enginecache build` does once its job is submitted, for a test-kind job (a child that sleeps).
WAITER = """
import signal
import sys
from pathlib import Path

# ^C as a terminal delivers it, even where this suite itself was started in the background by a
# non-interactive shell (`pytest ... &` starts it with SIGINT ignored, and every child inherits that)
signal.signal(signal.SIGINT, signal.default_int_handler)

import pytest
from enginecache.db import queue
from enginecache.service.context import AppContext
from enginecache.service.builds.submitwait import run_and_wait
app = AppContext.from_settings(Path(sys.argv[1]), sys.argv[2])
from enginecache.cli.app import sigterm_exits
with sigterm_exits():  # as the CLI's main(): SIGTERM ends the wait through its cleanup
    job = run_and_wait(app, queue.get_job(app.catalog, int(sys.argv[3])), timeout_seconds=float(sys.argv[4]))
print(job.status)
"""


# The killed waiter's job lease in the takeover test: its job is taken over once this has passed
# since that waiter's last heartbeat (every third of it), instead of the default 30 s. Only the
# killed waiter runs with it: until it is killed nobody else may claim the job (a late heartbeat
# loses nothing), and the waiter that takes the job over keeps the default lease while it runs it.
TAKEOVER_LEASE_SECONDS = "1"


def _env(**extra: str) -> dict[str, str]:
    return jobkinds_for_tests.env(**extra)


def _waiter_argv(app: AppContext, job_id: int) -> list[str]:
    return [sys.executable, "-c", WAITER, str(app.home), app.db_url, str(job_id), str(BOUND)]


@contextlib.contextmanager
def _waiter_running(
    app: AppContext, job_id: int, log: Path, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A WAITER process in a session of its own (its output in `log`), once its one-shot worker runs
    the job; on the way out its process group is killed, if anything of it is left."""
    with open(log, "wb") as sink:
        waiter = subprocess.Popen(
            _waiter_argv(app, job_id), cwd=ROOT, stdout=sink, stderr=sink, env=env or _env(), start_new_session=True
        )
    try:
        wait_for(
            lambda: queue.get_job(app.catalog, job_id).phase == "sleeping" or waiter.poll() is not None,
            BOUND,
            "the waiter's one-shot worker to run the job",
        )
        assert waiter.poll() is None, log.read_text()
        yield waiter
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(waiter.pid, signal.SIGKILL)
        waiter.wait()


@pytest.mark.slow
def test_concurrent_plain_builds_with_no_worker_all_finish(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app = catalog_ctx
    for i in range(CONCURRENT_BUILDS):
        model = make_mlp(tmp_path / f"m{i}.onnx", features=8 + i, hidden=16 + 2 * i, seed=i)
        register_model(app, model, name=f"m{i}")
    runs: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    for i in range(CONCURRENT_BUILDS):
        out, err = tmp_path / f"build{i}.out", tmp_path / f"build{i}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:  # files: a child holding a pipe blocks no reader
            command = [sys.executable, "-m", "enginecache.cli", "--home", str(app.home), "--db", app.db_url]
            runs.append(
                (
                    subprocess.Popen(
                        [*command, "build", f"m{i}", "--backend", "ort", "--json"],
                        cwd=ROOT,
                        stdout=stdout,
                        stderr=stderr,
                    ),
                    out,
                    err,
                )
            )
    deadline = time.monotonic() + BOUND
    codes = []
    try:
        for process, _, _ in runs:
            codes.append(process.wait(timeout=max(1.0, deadline - time.monotonic())))
    finally:
        for process, _, _ in runs:
            if process.poll() is None:
                process.kill()
                process.wait()
    for (_, out, err), code in zip(runs, codes, strict=True):
        assert code == 0, err.read_text()
        assert json.loads(out.read_text())["status"] == "READY"
    workers = queue.list_workers(app.catalog)
    assert len(workers) == CONCURRENT_BUILDS
    assert all(w.status == "offline" and not takes_queued_jobs(w.capabilities) for w in workers)
    assert live_workers(app) == []


@pytest.mark.slow
def test_waiter_killed_with_sigkill_leaves_no_live_worker_and_its_job_is_taken_over(
    catalog_ctx: AppContext, clock: FakeClock, tmp_path: Path
) -> None:
    app = catalog_ctx
    job = queue.enqueue(app.catalog, kind="sleep", payload={"seconds": 5}, requirements={"backend": "ort"}).job
    job_id = job.id or 0
    lease = _env(ENGINECACHE_LEASE_SECONDS=TAKEOVER_LEASE_SECONDS)
    with _waiter_running(app, job_id, tmp_path / "killed.log", env=lease) as killed:
        os.killpg(killed.pid, signal.SIGKILL)  # the waiter, its zygote and the job's child: no cleanup runs
    (row,) = queue.list_workers(app.catalog)
    assert row.status == "online" and row.name.startswith("oneshot-")  # it never got to say otherwise
    assert capable_workers(app, job) == []  # a one-shot worker never counts for other waiters
    clock.now = row.heartbeat_at  # the queue's clock at its last beat, then past its lease
    clock.advance(WORKER_ALIVE_SECONDS + 1)
    assert live_workers(app, clock=clock) == []  # its liveness lease is past: not live at all

    rescued = subprocess.run(
        _waiter_argv(app, job_id), cwd=ROOT, capture_output=True, text=True, env=_env(), timeout=BOUND, check=False
    )
    assert rescued.returncode == 0, rescued.stderr
    done = queue.get_job(app.catalog, job_id)
    assert rescued.stdout.strip() == JobStatus.SUCCEEDED, (done.error, rescued.stderr[-3000:])
    assert done.status == JobStatus.SUCCEEDED and done.attempts == 2


@pytest.mark.slow
def test_waiter_runs_the_job_itself_when_its_capable_worker_goes_away(catalog_ctx: AppContext, tmp_path: Path) -> None:
    """Waiting on a live queue worker that can run the job, then that worker's row goes offline
    (it never claimed the job): the wait re-asks, starts this host's one-shot worker, finishes."""
    app = catalog_ctx
    register_model(app, make_mlp(tmp_path / "m.onnx"), name="m")
    submitted = submit_build(app, BuildRequest(model="m", backend="ort"))
    assert submitted.job is not None
    job: JobRecord = submitted.job
    from enginecache.core.fingerprint import host_fingerprint

    host = host_fingerprint()
    queue.register_worker(
        app.catalog,
        name="queue-worker",
        hostname=host.hostname,
        pid=1,
        fingerprint=host.to_dict(),
        capabilities={**worker_capabilities(host), "scope": "queue"},
    )
    assert [w.name for w in capable_workers(app, job)] == ["queue-worker"]
    result: list[JobRecord | Exception] = []

    def wait() -> None:
        try:
            result.append(run_and_wait(app, job, timeout_seconds=BOUND))
        except Exception as err:  # noqa: BLE001 (handed to the test thread)
            result.append(err)

    waiter = threading.Thread(target=wait, daemon=True)
    waiter.start()
    time.sleep(1.0)  # the waiter polls meanwhile; the job stays queued for the worker it counts on
    assert queue.get_job(app.catalog, job.id or 0).status == JobStatus.QUEUED
    queue.worker_heartbeat(app.catalog, "queue-worker", current_job_id=None, status="offline")
    waiter.join(BOUND)
    assert not waiter.is_alive(), "the wait did not notice its worker had gone"
    (done,) = result
    assert isinstance(done, JobRecord), done
    assert done.status == JobStatus.SUCCEEDED and (done.lease_owner or "").startswith("oneshot-")


@pytest.mark.slow
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_waiter_stopped_by_a_signal_hands_the_job_back_and_goes_offline(
    catalog_ctx: AppContext, tmp_path: Path, stop: signal.Signals
) -> None:
    app = catalog_ctx
    job = queue.enqueue(app.catalog, kind="sleep", payload={"seconds": 120}, requirements={"backend": "ort"}).job
    job_id = job.id or 0
    log = tmp_path / "waiter.log"
    with _waiter_running(app, job_id, log) as waiter:
        waiter.send_signal(stop)
        code = waiter.wait(timeout=BOUND)
    assert code != 0, log.read_text()
    (row,) = queue.list_workers(app.catalog)
    assert row.status == "offline", log.read_text()
    back = queue.get_job(app.catalog, job_id)
    assert back.status == JobStatus.QUEUED and back.phase == "handed back" and back.attempts == 0


def test_the_lease_length_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from enginecache.errors import BuildOptionError
    from enginecache.service.jobs.worker import DEFAULT_LEASE_SECONDS, LEASE_SECONDS_ENV, lease_seconds_from_env

    monkeypatch.delenv(LEASE_SECONDS_ENV, raising=False)
    assert lease_seconds_from_env() == DEFAULT_LEASE_SECONDS == 30.0
    monkeypatch.setenv(LEASE_SECONDS_ENV, "6")
    assert lease_seconds_from_env() == 6.0
    for bad in ("0", "-5", "abc", "1e9"):
        monkeypatch.setenv(LEASE_SECONDS_ENV, bad)
        with pytest.raises(BuildOptionError, match=LEASE_SECONDS_ENV):
            lease_seconds_from_env()
