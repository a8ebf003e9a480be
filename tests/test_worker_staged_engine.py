"""A build job whose attempt fails after the engine was built does not build it again (issue 26,
finding 4): real workers publish to a real S3 server (moto). Attempt 1's store points at an address
where nothing listens, so its upload fails once the engine is built; the worker (`--once`) records
the attempt and exits, the built engine kept in the job's staging folder with its digests. Attempt 2,
run by a worker that reaches the server, hashes the staged engine again and publishes it without
calling the backend: its log has no build phase, says which attempt built the engine, and the READY
engine's sha256 is the one attempt 1 tried to upload. The staging folder goes with the job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.core.hashing import hash_file
from enginecache.db import queue
from enginecache.db.models import JobStatus
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.jobs.staging import staging_dir
from enginecache.service.models.register import register_model
from tests.modelfactory import make_mlp
from tests.s3kit import S3Server, free_port, running_server, wait_for

ROOT = Path(__file__).resolve().parents[1]
DEADLINE_SECONDS = 240.0  # each worker's whole run: it ends well inside this or it hangs
ORT_BUILD_PHASE = "[phase] Optimizing for this CPU"  # what ONNX Runtime's build reports as it starts


@pytest.fixture
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


def _run_worker(app: AppContext, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "enginecache.cli", "--home", str(app.home), "--db", app.db_url, "worker", *args]
    with open(log, "ab") as sink:
        return subprocess.Popen(argv, cwd=ROOT, stdout=sink, stderr=sink, env=env)


def _stop(worker: subprocess.Popen[bytes], log: Path) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()
        pytest.fail(f"the worker did not stop on SIGTERM:\n{log.read_text()[-3000:]}")


@pytest.mark.slow
def test_a_retry_after_a_failed_upload_publishes_the_staged_engine_without_building_it(
    server: S3Server, app_ctx: AppContext, tmp_path: Path
) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    job = submit_build(app_ctx, BuildRequest(model="mlp", backend="ort"), max_attempts=2).job
    assert job is not None and job.id is not None
    job_id = job.id
    prefix = f"staged-{uuid.uuid4().hex[:12]}"
    log = tmp_path / "worker.log"
    nowhere = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every request is refused
    down = {**os.environ, **server.env(prefix, endpoint=nowhere, ENGINECACHE_STORE_RETRY_SECONDS="1")}
    first = _run_worker(app_ctx, down, log, "--name", "w1", "--once")
    try:
        first.wait(timeout=DEADLINE_SECONDS)
    finally:
        _stop(first, log)

    after_one = queue.get_job(app_ctx.catalog, job_id)
    assert after_one.status == JobStatus.QUEUED and after_one.attempts == 1, (after_one.status, after_one.error)
    assert ORT_BUILD_PHASE in after_one.log_tail, "attempt 1 built the engine"
    tried = re.search(rf"{prefix}/objects/sha256/[0-9a-f]{{2}}/([0-9a-f]{{64}})", after_one.error or "")
    assert tried is not None, after_one.error
    staged = staging_dir(app_ctx.store.tmp_dir, job_id)
    record = json.loads((staged / "engine.json").read_text())
    assert record["digest"]["sha256"] == tried.group(1) == hash_file(staged / "engine.plan").sha256
    assert record["built_by"] == [job_id, 1]
    assert server.keys(prefix) == [], "nothing reached the bucket"

    up = {**os.environ, **server.env(prefix)}
    second = _run_worker(app_ctx, up, log, "--name", "w2")
    try:
        done = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)
        wait_for(
            lambda: queue.get_job(app_ctx.catalog, job_id).status in done,
            f"job {job_id} to end (the workers' log: {log})",
            DEADLINE_SECONDS,
        )
    finally:
        _stop(second, log)

    ended = queue.get_job(app_ctx.catalog, job_id)
    assert ended.status == JobStatus.SUCCEEDED and ended.attempts == 2, (ended.status, ended.error)
    reuse = f"[staged] not built again: attempt 2 publishes the engine attempt 1 of job {job_id} built and staged"
    assert reuse in ended.log_tail, ended.log_tail
    assert ORT_BUILD_PHASE not in ended.log_tail, f"attempt 2 called the backend's build:\n{ended.log_tail}"
    assert ended.result_engine_id is not None
    engine = get_engine(app_ctx, ended.result_engine_id)
    assert engine.status == "READY" and engine.job_attempt == 2
    assert engine.sha256 == tried.group(1), "the engine attempt 1 built, not another"
    assert reuse in (engine.builder_log or "")
    assert engine.blob_path is not None
    assert hash_file(app_ctx.home / engine.blob_path).sha256 == engine.sha256
    assert any(key.endswith(f"/{engine.sha256}") for key in server.keys(prefix)), server.keys(prefix)
    assert not staged.exists(), "the staging folder goes with the job"
    assert sorted(p.name for p in app_ctx.store.tmp_dir.iterdir()) == [], "no temp file left"
