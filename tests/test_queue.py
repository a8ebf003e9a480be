"""The queue's semantics on the real databases: atomic claims, leases, attempts, idempotency, cancel.

Leases and backoff run on a controlled clock (the queue's `clock=` parameter, `FakeClock`): a test
moves time past an expiry instead of sleeping past it.
"""

from __future__ import annotations

import threading
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from enginecache.core.fingerprint import host_fingerprint
from enginecache.db import queue
from enginecache.db.catalog import Catalog
from enginecache.db.models import JobStatus, WorkerRecord, utcnow
from enginecache.errors import StaleLeaseError, TargetError
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import job_to_dict, submit_build
from enginecache.service.context import AppContext
from enginecache.service.jobs.worker import Worker, WorkerConfig
from enginecache.service.models.register import register_model
from tests.conftest import FakeClock
from tests.modelfactory import make_mlp

RTX = {"backend": "rtx"}


def _always(_requirements: Any) -> bool:
    return True


def test_many_workers_never_claim_the_same_job(catalog_ctx: AppContext) -> None:
    catalog = catalog_ctx.catalog
    total = 60
    for index in range(total):
        queue.enqueue(catalog, kind="build", payload={"n": index}, requirements=RTX)
    claimed: list[int] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work(name: str) -> None:
        own = Catalog(catalog.url, migrate=False)
        try:
            while (lease := queue.claim(own, worker=name, can_run=_always, lease_seconds=60)) is not None:
                with lock:
                    claimed.append(lease.job.id or 0)
                queue.complete(own, lease.job.id or 0, lease.token, status=JobStatus.SUCCEEDED)
        except Exception as err:  # noqa: BLE001 - collected and asserted empty below
            errors.append(err)
        finally:
            own.dispose()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    counts = Counter(claimed)
    assert len(claimed) == total
    assert [job for job, n in counts.items() if n > 1] == []
    assert {j.status for j in queue.list_jobs(catalog)} == {JobStatus.SUCCEEDED}


def test_expired_lease_is_taken_over_and_stale_writes_are_rejected(catalog_ctx: AppContext, clock: FakeClock) -> None:
    catalog = catalog_ctx.catalog
    job = queue.enqueue(catalog, kind="build", payload={}, requirements=RTX, clock=clock).job
    first = queue.claim(catalog, worker="a", can_run=_always, lease_seconds=30, clock=clock)
    assert first is not None and first.job.attempts == 1
    assert first.job.started_at == clock.now and first.job.lease_expires_at == clock.now + timedelta(seconds=30)
    clock.advance(30)
    assert queue.claim(catalog, worker="b", can_run=_always, lease_seconds=30, clock=clock) is None, "valid until then"
    clock.advance(0.001)
    second = queue.claim(catalog, worker="b", can_run=_always, lease_seconds=30, clock=clock)
    assert second is not None and second.job.id == job.id
    assert second.job.attempts == 2 and second.token != first.token
    with pytest.raises(StaleLeaseError):
        queue.report_progress(catalog, job.id or 0, first.token, progress=0.5, phase="old holder", clock=clock)
    with pytest.raises(StaleLeaseError):
        queue.heartbeat(catalog, job.id or 0, first.token, 30, clock=clock)
    with pytest.raises(StaleLeaseError):
        queue.complete(catalog, job.id or 0, first.token, status=JobStatus.SUCCEEDED, clock=clock)
    queue.report_progress(catalog, job.id or 0, second.token, progress=0.5, phase="new holder", clock=clock)
    clock.advance(5)
    done = queue.complete(catalog, job.id or 0, second.token, status=JobStatus.SUCCEEDED, clock=clock)
    assert done.status == JobStatus.SUCCEEDED and done.finished_at == clock.now
    assert queue.get_job(catalog, job.id or 0).phase == "new holder"


def test_heartbeat_keeps_the_lease_from_expiring(catalog_ctx: AppContext, clock: FakeClock) -> None:
    catalog = catalog_ctx.catalog
    job = queue.enqueue(catalog, kind="build", payload={}, requirements=RTX, clock=clock).job
    lease = queue.claim(catalog, worker="a", can_run=_always, lease_seconds=10, clock=clock)
    assert lease is not None
    for _ in range(5):  # 40 s in all, never more than 8 s between beats
        clock.advance(8)
        assert queue.heartbeat(catalog, job.id or 0, lease.token, 10, clock=clock) is False
        assert queue.claim(catalog, worker="b", can_run=_always, lease_seconds=10, clock=clock) is None
    assert queue.get_job(catalog, job.id or 0).lease_expires_at == clock.now + timedelta(seconds=10)
    queue.request_cancel(catalog, job.id or 0, clock=clock)
    clock.advance(8)
    assert queue.heartbeat(catalog, job.id or 0, lease.token, 10, clock=clock) is True, "the beat reports the cancel"
    clock.advance(10.001)  # the holder stops beating: its lease runs out and the next claim settles the cancel
    assert queue.claim(catalog, worker="b", can_run=_always, lease_seconds=10, clock=clock) is None
    cancelled = queue.get_job(catalog, job.id or 0)
    assert cancelled.status == JobStatus.CANCELLED and cancelled.finished_at == clock.now


def test_attempts_are_capped_then_dead(catalog_ctx: AppContext, clock: FakeClock) -> None:
    catalog = catalog_ctx.catalog
    job = queue.enqueue(catalog, kind="build", payload={}, requirements=RTX, max_attempts=2, clock=clock).job
    lease = queue.claim(catalog, worker="a", can_run=_always, lease_seconds=30, clock=clock)
    assert lease is not None
    retried = queue.fail_attempt(
        catalog, job.id or 0, lease.token, error="child killed by SIGKILL", backoff_seconds=60, clock=clock
    )
    assert retried.status == JobStatus.QUEUED and retried.run_after == clock.now + timedelta(seconds=60)
    clock.advance(59.999)
    assert queue.claim(catalog, worker="a", can_run=_always, lease_seconds=30, clock=clock) is None, "backoff holds it"
    clock.advance(0.001)
    lease = queue.claim(catalog, worker="a", can_run=_always, lease_seconds=30, clock=clock)
    assert lease is not None and lease.job.attempts == 2, "runnable from the end of its backoff"
    clock.advance(30.001)  # the holder dies: its lease expires on the last attempt
    assert queue.claim(catalog, worker="b", can_run=_always, lease_seconds=30, clock=clock) is None
    dead = queue.get_job(catalog, job.id or 0)
    assert dead.status == JobStatus.DEAD and dead.attempts == 2 and dead.finished_at == clock.now
    assert "lease of a expired on the last attempt (attempt 1 failed: child killed by SIGKILL)" in (dead.error or "")


def test_a_claim_waiting_for_the_write_lock_reads_the_clock_once_it_holds_it(app_ctx: AppContext) -> None:
    """The lease, and the attempt's timeout (counted from `started_at`), start when the claim holds
    SQLite's write lock, not when it began waiting for it (up to the busy timeout)."""
    import sqlite3

    catalog = app_ctx.catalog
    queue.enqueue(catalog, kind="build", payload={}, requirements=RTX)
    released = threading.Event()
    readings: list[bool] = []

    def clock() -> datetime:
        readings.append(released.is_set())
        return utcnow()

    claimed: list[queue.Lease | None] = []
    blocker = sqlite3.connect(app_ctx.home / "catalog.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    claimer = threading.Thread(
        target=lambda: claimed.append(queue.claim(catalog, worker="a", can_run=_always, lease_seconds=30, clock=clock))
    )
    claimer.start()
    claimer.join(0.5)
    assert claimer.is_alive(), "the claim cannot finish while another connection holds the write lock"
    released.set()
    blocker.execute("ROLLBACK")
    blocker.close()
    claimer.join(30)
    assert claimed and claimed[0] is not None
    assert readings and all(readings), "the clock was read only once the claim held the write lock"


def test_cancel_queued_job_never_runs(catalog_ctx: AppContext) -> None:
    catalog = catalog_ctx.catalog
    job = queue.enqueue(catalog, kind="build", payload={}, requirements=RTX).job
    cancelled = queue.request_cancel(catalog, job.id or 0)
    assert cancelled.status == JobStatus.CANCELLED
    assert queue.claim(catalog, worker="a", can_run=_always, lease_seconds=30) is None


def test_routing_claims_only_runnable_jobs_and_says_what_is_missing(catalog_ctx: AppContext) -> None:
    catalog = catalog_ctx.catalog
    trt = queue.enqueue(
        catalog, kind="build", payload={}, requirements={"backend": "trt", "compute_capability": "sm86"}
    ).job
    worker = Worker(catalog_ctx, WorkerConfig(name="cpu-box", once=True))
    worker.run()  # registers, finds nothing it can run, exits
    still = queue.get_job(catalog, trt.id or 0)
    assert still.status == JobStatus.QUEUED and still.attempts == 0
    assert job_to_dict(catalog_ctx, still)["waiting"] == "waiting for a worker with TensorRT and an SM86 GPU"


@pytest.mark.slow
def test_eight_identical_submissions_make_one_job_and_one_build(catalog_ctx: AppContext, tmp_path: Path) -> None:
    register_model(catalog_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    request = BuildRequest(model="mlp", backend="rtx", targets=("sm86",))
    results: list[Any] = []
    barrier = threading.Barrier(8)

    def submit() -> None:
        own = AppContext.from_settings(catalog_ctx.home, catalog_ctx.db_url)
        try:
            barrier.wait()
            results.append(submit_build(own, request))
        finally:
            own.close()

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    job_ids = {r.job.id for r in results}
    assert len(results) == 8 and len(job_ids) == 1
    assert sum(not r.joined for r in results) == 1
    Worker(catalog_ctx, WorkerConfig(name="w", once=True)).run()
    job = queue.get_job(catalog_ctx.catalog, job_ids.pop() or 0)
    assert job.status == JobStatus.SUCCEEDED, job.error
    from enginecache.service.engines.records import list_engines

    assert len(list_engines(catalog_ctx)) == 1, "one build"
    again = submit_build(catalog_ctx, request)
    assert again.cache_hit is True and again.engine is not None and again.engine.id == job.result_engine_id


@pytest.mark.slow
def test_cli_queue_worker_and_job_show(app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.clirunner import run_cli
    from tests.modelfactory import make_conv

    register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="conv")
    home = ["--home", str(app_ctx.home)]
    queued = run_cli(capsys, *home, "build", "conv", "--target", "sm86", "--queue", "--json")
    assert queued.code == 0, queued.err
    submitted = queued.json()
    assert submitted["status"] == JobStatus.QUEUED and submitted["joined"] is False
    version = run_cli(capsys, *home, "fingerprint", "--json").json()["packages"]["tensorrt_rtx"]
    assert submitted["waiting"] == f"waiting for a worker with TensorRT-RTX {version} on Linux", "no worker runs yet"
    joined = run_cli(capsys, *home, "build", "conv", "--target", "sm86", "--queue", "--json").json()
    assert joined["job_id"] == submitted["job_id"] and joined["joined"] is True
    listed = run_cli(capsys, *home, "jobs", "--status", "queued", "--json").json()
    assert [j["id"] for j in listed] == [submitted["job_id"]]

    ran = run_cli(capsys, *home, "worker", "--once", "--name", "w-once")
    assert ran.code == 0, ran.err
    assert "ran 1 job(s)" in ran.err
    shown = run_cli(capsys, *home, "job", "show", str(submitted["job_id"]), "--json").json()
    for key in (
        "id",
        "kind",
        "status",
        "attempts",
        "progress",
        "phase",
        "worker",
        "requirements",
        "error",
        "log_tail",
        "created_at",
        "started_at",
        "finished_at",
        "result_engine_id",
    ):
        assert key in shown, key
    assert shown["status"] == JobStatus.SUCCEEDED and shown["attempts"] == 1 and shown["worker"] == "w-once"
    assert shown["progress"] == 1.0
    assert shown["phase"].startswith("Building engine: "), shown["phase"]  # the newest TensorRT phase
    assert "[phase] " in shown["log_tail"], "phases are in the tail"
    assert "[VERBOSE] Adding 1 engine(s) to plan file." in shown["log_tail"], "TensorRT's own log lines are in the tail"
    assert shown["result_engine_id"] is not None
    hit = run_cli(capsys, *home, "build", "conv", "--target", "sm86", "--json").json()
    assert hit["cache_hit"] is True and hit["id"] == shown["result_engine_id"]

    cancelled = run_cli(capsys, *home, "build", "conv", "--target", "sm80", "--queue", "--json").json()
    done = run_cli(capsys, *home, "job", "cancel", str(cancelled["job_id"]), "--json").json()
    assert done["status"] == JobStatus.CANCELLED
    assert run_cli(capsys, *home, "worker", "--once").err.strip().endswith("ran 0 job(s)")


@pytest.mark.slow
def test_worker_concurrency_runs_jobs_side_by_side(app_ctx: AppContext, tmp_path: Path) -> None:
    from tests.modelfactory import make_conv

    register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="conv")
    jobs = [
        submit_build(app_ctx, BuildRequest(model="conv", backend="rtx", targets=(sm,))).job for sm in ("sm86", "sm89")
    ]
    Worker(app_ctx, WorkerConfig(name="pair", once=True, concurrency=2)).run()
    done = [queue.get_job(app_ctx.catalog, job.id or 0) for job in jobs if job is not None]
    assert [j.status for j in done] == [JobStatus.SUCCEEDED, JobStatus.SUCCEEDED]
    assert {j.lease_owner for j in done} == {"pair"}
    starts = [j.started_at for j in done]
    ends = [j.finished_at for j in done]
    assert all(starts) and all(ends)
    assert max(s for s in starts if s) < min(e for e in ends if e), "the two attempts overlapped in time"


def test_jobs_a_worker_cannot_run_do_not_hide_newer_ones(catalog_ctx: AppContext) -> None:
    catalog = catalog_ctx.catalog
    trt = {"backend": "trt", "compute_capability": "sm86"}
    for index in range(60):
        queue.enqueue(catalog, kind="build", payload={"n": index}, requirements=trt)
    mine = queue.enqueue(catalog, kind="build", payload={}, requirements=RTX).job

    def cpu_worker(requirements: Any) -> bool:
        return bool(requirements.get("backend") == "rtx")

    lease = queue.claim(catalog, worker="cpu", can_run=cpu_worker, lease_seconds=30)
    assert lease is not None and lease.job.id == mine.id
    assert queue.claim(catalog, worker="cpu", can_run=cpu_worker, lease_seconds=30) is None
    assert sum(j.status == JobStatus.QUEUED for j in queue.list_jobs(catalog)) == 60


def test_deterministic_build_failure_is_not_retried(app_ctx: AppContext, tmp_path: Path) -> None:
    from tests.test_build import _int32_bias_qdq

    register_model(app_ctx, _int32_bias_qdq(tmp_path), name="badq")
    job = submit_build(app_ctx, BuildRequest(model="badq", backend="rtx", targets=("sm86",))).job
    assert job is not None
    Worker(app_ctx, WorkerConfig(name="w", job_id=job.id)).run()
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.FAILED and done.attempts == 1
    assert "conv_b_DequantizeLinear" in (done.error or "")


@pytest.mark.slow
def test_unexpected_child_error_is_recorded_and_retried_until_dead(app_ctx: AppContext) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements=RTX, max_attempts=2).job
    Worker(app_ctx, WorkerConfig(name="w", job_id=job.id, backoff_base_seconds=0.1)).run()
    dead = queue.get_job(app_ctx.catalog, job.id or 0)
    assert dead.status == JobStatus.DEAD and dead.attempts == 2
    assert "child exited with status 3: KeyError: 'model'" in (dead.error or ""), dead.error
    assert list((app_ctx.home / "tmp").iterdir()) == []


@pytest.mark.slow
def test_cli_build_waits_through_a_backoff_and_runs_the_retry(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.clirunner import run_cli

    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    job = submit_build(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm86",))).job
    assert job is not None
    lease = queue.claim(app_ctx.catalog, worker="crashed", can_run=_always, lease_seconds=30)
    assert lease is not None
    queue.fail_attempt(app_ctx.catalog, job.id or 0, lease.token, error="child killed by SIGKILL", backoff_seconds=1.0)
    result = run_cli(capsys, "--home", str(app_ctx.home), "build", "mlp", "--target", "sm86", "--json")
    assert result.code == 0, result.err
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.SUCCEEDED and done.attempts == 2
    assert result.json()["id"] == done.result_engine_id


@pytest.mark.usefixtures("requires_no_gpu")
def test_trt_build_from_a_cpu_host_is_planned_for_a_live_gpu_worker_fake_gpu_worker(
    app_ctx: AppContext, tmp_path: Path
) -> None:
    """The GPU worker here is a catalog row standing in for a host with TensorRT and an A10 (no
    machine we have runs full TensorRT); everything else is real."""
    from enginecache.service.builds.submit import waiting_reason

    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    request = BuildRequest(model="mlp", backend="trt", targets=("sm86",))
    with pytest.raises(TargetError, match="no live worker has TensorRT and an SM86 GPU"):
        submit_build(app_ctx, request)
    gpu = {"index": 0, "name": "NVIDIA A10", "uuid": "GPU-1", "compute_capability": "sm86", "memory_total_bytes": 1}
    fingerprint = {**host_fingerprint().to_dict(), "hostname": "gpu-node-1", "gpus": [gpu]}
    queue.register_worker(
        app_ctx.catalog,
        name="gpu-node-1",
        hostname="gpu-node-1",
        pid=1,
        fingerprint=fingerprint,
        capabilities={
            "backends": ["trt"],
            "versions": {"trt": "10.13.0.35"},
            "gpus": [{"name": "NVIDIA A10", "compute_capability": "sm86"}],
            "cpu_target": "x86_64-avx2",
            "os": "Linux",
        },
    )
    job = submit_build(app_ctx, request).job
    assert job is not None
    assert job.requirements == {
        "backend": "trt",
        "backend_version": "10.13.0.35",
        "os": "Linux",
        "compute_capability": "sm86",
    }
    assert waiting_reason(app_ctx, job) is None, "a live worker can run it"
    assert Worker(app_ctx, WorkerConfig(name="cpu", once=True)).run() == 0, "this CPU host does not claim it"
    with app_ctx.catalog.write() as session:
        row = session.exec(select(WorkerRecord).where(WorkerRecord.name == "gpu-node-1")).one()
        row.heartbeat_at = utcnow() - timedelta(minutes=5)
        session.add(row)
    again = queue.get_job(app_ctx.catalog, job.id or 0)
    assert waiting_reason(app_ctx, again) == "waiting for a worker with TensorRT 10.13.0.35 and an SM86 GPU on Linux"
