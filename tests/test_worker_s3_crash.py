"""A real worker builds an engine and publishes it to an S3 server that is SIGKILLed while the upload
is in flight (`GatedProxy` holds the PUT part way, then the server dies): the job ends, retried and
then DEAD once out of attempts, with a one-line reason that names the object's key and the
client's error, and the worker exits. Nothing waits on a sleep: the kill lands when the proxy holds
bytes, and the worker has a hard deadline."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.modelfactory import make_mlp
from tests.s3kit import BUCKET, GatedProxy, S3Server, running_server, wait_for

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_SECONDS = 240.0  # the whole job, every attempt and backoff: it ends well inside this or it hangs
HOLD_AFTER_BYTES = 2000  # the PUT's headers and the head of its body reach the server; the rest is held


@pytest.fixture
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


@pytest.mark.slow
def test_a_worker_whose_s3_server_dies_mid_upload_ends_the_job_with_a_one_line_reason(
    server: S3Server, app_ctx: AppContext, tmp_path: Path
) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")  # local only: no remote yet
    job = submit_build(app_ctx, BuildRequest(model="mlp", backend="ort"), max_attempts=2).job
    assert job is not None and job.id is not None
    job_id = job.id
    prefix = f"worker-{uuid.uuid4().hex[:12]}"
    proxy = GatedProxy(server.port)
    log = tmp_path / "worker.log"
    env = {**os.environ, **server.env(prefix, endpoint=proxy.endpoint, ENGINECACHE_STORE_RETRY_SECONDS="2")}
    argv = [sys.executable, "-m", "enginecache.cli", "--home", str(app_ctx.home), "--db", app_ctx.db_url]
    try:
        proxy.hold_after(HOLD_AFTER_BYTES)
        with open(log, "wb") as sink:
            worker = subprocess.Popen([*argv, "worker", "--name", "w1"], cwd=ROOT, stdout=sink, stderr=sink, env=env)
        try:
            assert proxy.holding.wait(DEADLINE_SECONDS), "the upload never reached the gate"
            assert server.keys(prefix) == []  # in flight: nothing visible
            server.kill()
            proxy.close()
            finished = (JobStatus.DEAD, JobStatus.FAILED, JobStatus.SUCCEEDED)
            wait_for(
                lambda: queue.get_job(app_ctx.catalog, job_id).status in finished,
                f"job {job_id} to end (the worker's log: {log})",
                DEADLINE_SECONDS,
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(timeout=60)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
                pytest.fail(f"the worker did not stop on SIGTERM:\n{log.read_text()[-3000:]}")
    finally:
        proxy.close()
    ended = queue.get_job(app_ctx.catalog, job_id)
    assert ended.status == JobStatus.DEAD, (ended.status, ended.error)
    assert ended.attempts == 2
    error = ended.error or ""
    assert "\n" not in error and len(error) <= 1100, error
    key = rf"s3://{BUCKET}/{prefix}/objects/sha256/[0-9a-f]{{2}}/[0-9a-f]{{64}}"
    assert re.search(key, error), error
    assert error.startswith("attempt 2 of 2 failed: "), error
    assert "Debug source" not in error and not error.endswith("}"), error
    assert "error sending request" in error, error  # the client's own account of the dead server, whole
