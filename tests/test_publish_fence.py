"""A build host whose job was taken over publishes nothing: the lease is checked between the build and
the publish (`ProgressWriter.fence`, `run_build(before_publish=...)`).

Two worker processes with homes of their own share a PostgreSQL catalog and an S3 server. Worker A runs
a `held_build` (a test-only job kind of tests/jobkinds_for_tests.py: a real build that waits before
publishing on its first attempt) and is frozen (SIGSTOP) there, so its heartbeat stops and the lease
runs out; worker B takes the job over and publishes. A's child, released while A is still frozen (so A's
own heartbeat cannot stop it first), reaches the publish with a stale lease: refused, before a byte goes
to its store or the bucket. Without the fence A's blob would be in its own store.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlmodel import col, select

from enginecache.core.objectstore import blob_key
from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus, JobStatus, utcnow
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import request_payload
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests import jobkinds_for_tests
from tests.conftest import files_under, wait_for
from tests.modelfactory import make_mlp
from tests.s3kit import S3Server, running_server
from tests.servingkit import ROOT


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


def _worker(home: Path, db_url: str, env: dict[str, str], name: str, *extra: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "enginecache.cli", "--home", str(home), "--db", db_url, "worker", "--name", name]
    with open(home.parent / f"{name}.log", "ab") as log:
        return subprocess.Popen([*argv, *extra], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)


def _freeze_outside_transactions(app: AppContext, pid: int, job_id: int) -> None:
    """SIGSTOP `pid` at a moment it holds no lock on the job's row (a heartbeat locks it FOR UPDATE:
    frozen inside one, it would block every other writer of the row)."""
    import sqlalchemy as sa

    for _ in range(200):
        os.kill(pid, signal.SIGSTOP)
        try:
            with app.catalog.engine.begin() as connection:
                connection.execute(sa.text("SELECT id FROM jobs WHERE id = :id FOR UPDATE NOWAIT"), {"id": job_id})
            return
        except sa.exc.OperationalError:
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.05)
    raise AssertionError("could not freeze the worker outside a transaction on the job's row")


def test_a_host_whose_job_was_taken_over_publishes_nothing(
    server: S3Server,
    pg_url: str,
    app_factory: Callable[..., AppContext],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prefix = f"fence-{uuid.uuid4().hex[:10]}"
    store_env = server.env(prefix)
    for key, value in store_env.items():
        monkeypatch.setenv(key, value)
    app = app_factory(home=tmp_path / "registry", db_url=pg_url)
    model = register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    release = tmp_path / "release"
    payload = {**request_payload(BuildRequest(model="mlp", backend="ort"), model.id or 0), "release_file": str(release)}
    job_id = queue.enqueue(app.catalog, kind="held_build", payload=payload, requirements={"backend": "ort"}).job.id
    assert job_id is not None
    env = jobkinds_for_tests.env(**store_env)
    homes = {name: tmp_path / name for name in ("host-a", "host-b")}
    a = _worker(homes["host-a"], pg_url, env, "host-a", "--lease-seconds", "2")
    try:
        held = jobkinds_for_tests.HELD_PHASE
        wait_for(lambda: queue.get_job(app.catalog, job_id).phase == held, 120, "A to hold the build")
        _freeze_outside_transactions(app, a.pid, job_id)  # the worker, not its child: its heartbeat stops
        wait_for(lambda: (queue.get_job(app.catalog, job_id).lease_expires_at or utcnow()) < utcnow(), 60, "lapse")
        b = _worker(homes["host-b"], pg_url, env, "host-b", "--once")
        assert b.wait(timeout=300) == 0, (tmp_path / "host-b.log").read_text()
        job = queue.get_job(app.catalog, job_id)
        assert (job.status, job.attempts, job.lease_owner) == (JobStatus.SUCCEEDED, 2, "host-b"), (
            job.error,
            (tmp_path / "host-b.log").read_text()[-3000:],
        )
        release.touch()  # A's child goes on to the publish while A itself is still frozen

        def attempt_one() -> EngineRecord | None:
            query = select(EngineRecord).where(col(EngineRecord.job_id) == job_id, col(EngineRecord.job_attempt) == 1)
            with app.catalog.read() as session:
                row = session.exec(query).first()
            return row if row is not None and row.status != EngineStatus.PENDING else None

        wait_for(lambda: attempt_one() is not None, 120, "A's attempt to end")
        late = attempt_one()
        os.kill(a.pid, signal.SIGCONT)
        assert late is not None and late.status == EngineStatus.FAILED and late.sha256 is None
        assert "lease token is stale" in (late.error or "") or "lease lost" in (late.error or "")
    finally:
        os.kill(a.pid, signal.SIGCONT)
        release.touch()  # a child still held goes on (and is refused), so the worker can finish
        a.terminate()
        try:
            a.wait(timeout=120)
        except subprocess.TimeoutExpired:
            a.kill()  # never mask the test's own failure with this one
            a.wait(timeout=60)
    log = (tmp_path / "host-a.log").read_text()
    assert f"job {job_id}" in log and "write rejected" in log, log
    assert [p for p in files_under(homes["host-a"] / "objects")] == [], "A published nothing to its own store"
    ready = queue.get_job(app.catalog, job_id).result_engine_id
    with app.catalog.read() as session:
        engine = session.get(EngineRecord, ready)
    assert engine is not None and engine.status == EngineStatus.READY and engine.job_attempt == 2
    expected = {f"{prefix}/{blob_key(engine.sha256 or '')}"} | {
        f"{prefix}/{blob_key(str(sha))}" for sha, _ in model.info["remote_files"].values()
    }
    assert set(server.keys(prefix)) == expected, "the bucket holds B's engine and the model, nothing of A's"
