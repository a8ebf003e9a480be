"""Queue benchmark: pickup latency, queue overhead vs direct builds, 8-way identical submissions.

Run: .venv/bin/python bench/bench_queue.py [--builds 50] [--latency-jobs 20]
Prints the figures and writes bench/results/queue.json. Needs ../shared/models (mobilenet) and,
for the PostgreSQL rows, the server on 127.0.0.1:5432.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from enginecache.db import queue  # noqa: E402
from enginecache.db.models import JobStatus  # noqa: E402
from enginecache.service.builds.plan import BuildRequest, build_engine  # noqa: E402
from enginecache.service.builds.submit import submit_build  # noqa: E402
from enginecache.service.context import AppContext  # noqa: E402
from enginecache.service.engines.records import list_engines  # noqa: E402
from enginecache.service.models.register import register_model  # noqa: E402
from tests.modelfactory import make_mlp  # noqa: E402

MOBILENET = ROOT.parent / "shared" / "models" / "mobilenet_v3_small.onnx"
PG_ADMIN = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


@contextmanager
def database(kind: str, home: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{home / 'catalog.db'}"
        return
    admin = sa.create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    name = f"enginecache_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield sa.make_url(PG_ADMIN).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@contextmanager
def workers(home: Path, db_url: str, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "enginecache.cli",
                "--home",
                str(home),
                "--db",
                db_url,
                "worker",
                "--name",
                f"bench-{i}",
            ],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(count)
    ]
    app = AppContext.from_settings(home, db_url)
    deadline = time.monotonic() + 60
    while len(queue.list_workers(app.catalog)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    app.close()  # a worker registers once its zygote is warm: no warm-up wait is needed
    try:
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait(timeout=60)


def mobilenet_request(index: int) -> BuildRequest:
    # Distinct profiles give distinct cache keys: every request is a real build.
    profile = f"input=1x3x224x224,1x3x224x224,{index + 1}x3x224x224"
    return BuildRequest(model="mobilenet", backend="rtx", targets=("sm86",), profiles=(profile,))


def wait_all(app: AppContext, job_ids: list[int], timeout: float = 1800) -> None:
    deadline = time.monotonic() + timeout
    pending = set(job_ids)
    while pending and time.monotonic() < deadline:
        pending = {
            j
            for j in pending
            if queue.get_job(app.catalog, j).status not in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD)
        }
        time.sleep(0.05)
    failed = [j for j in job_ids if queue.get_job(app.catalog, j).status != JobStatus.SUCCEEDED]
    if pending or failed:
        raise RuntimeError(f"jobs not done: pending {sorted(pending)}, failed {failed}")


def bench_latency(kind: str, jobs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        with database(kind, home) as url:
            app = AppContext.from_settings(home, url)
            register_model(app, make_mlp(home / "src" / "mlp.onnx"), name="mlp")
            latencies = []
            with workers(home, url, 1):
                for index in range(jobs):
                    request = BuildRequest(
                        model="mlp", backend="rtx", targets=("sm86",), profiles=(f"input=1x16,1x16,{index + 1}x16",)
                    )
                    job = submit_build(app, request).job
                    assert job is not None
                    wait_all(app, [job.id or 0])
                    done = queue.get_job(app.catalog, job.id or 0)
                    # started_at is the claim of the last attempt; one attempt here.
                    latencies.append(((done.started_at or done.created_at) - done.created_at).total_seconds())
            app.close()
    latencies.sort()
    return {
        "jobs": jobs,
        "p50_s": statistics.median(latencies),
        "p95_s": latencies[max(0, round(0.95 * len(latencies)) - 1)],
        "max_s": latencies[-1],
    }


def bench_overhead(builds: int) -> dict[str, float]:
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "direct"
        app = AppContext.from_settings(home)
        register_model(app, MOBILENET, name="mobilenet")
        build_engine(app, BuildRequest(model="mobilenet", backend="rtx", targets=("sm80",)))  # warm-up
        started = time.perf_counter()
        for index in range(builds):
            build_engine(app, mobilenet_request(index))
        results["direct_s"] = time.perf_counter() - started
        app.close()
        for count in (1, 2):
            home = Path(tmp) / f"queue{count}"
            url = f"sqlite:///{home / 'catalog.db'}"
            app = AppContext.from_settings(home, url)
            register_model(app, MOBILENET, name="mobilenet")
            with workers(home, url, count):
                started = time.perf_counter()
                ids = []
                for index in range(builds):
                    job = submit_build(app, mobilenet_request(index)).job
                    assert job is not None
                    ids.append(job.id or 0)
                wait_all(app, ids)
                results[f"queue_{count}_workers_s"] = time.perf_counter() - started
            assert len(list_engines(app)) == builds
            app.close()
    results["builds"] = builds
    results["ratio_1_worker"] = results["queue_1_workers_s"] / results["direct_s"]
    results["throughput_direct_per_min"] = 60 * builds / results["direct_s"]
    results["throughput_1_worker_per_min"] = 60 * builds / results["queue_1_workers_s"]
    results["throughput_2_workers_per_min"] = 60 * builds / results["queue_2_workers_s"]
    return results


def bench_identical(kind: str) -> dict[str, int]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        with database(kind, home) as url:
            app = AppContext.from_settings(home, url)
            register_model(app, MOBILENET, name="mobilenet")
            request = mobilenet_request(0)
            barrier = threading.Barrier(8)
            jobs: list[int | None] = []

            def submit() -> None:
                own = AppContext.from_settings(home, url)
                barrier.wait()
                result = submit_build(own, request)
                jobs.append(result.job.id if result.job else None)
                own.close()

            with workers(home, url, 2):
                threads = [threading.Thread(target=submit) for _ in range(8)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                wait_all(app, sorted({j for j in jobs if j is not None}))
            builds = len(list_engines(app))
            app.close()
    return {"submissions": 8, "distinct_jobs": len({j for j in jobs if j is not None}), "builds": builds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--builds", type=int, default=50)
    parser.add_argument("--latency-jobs", type=int, default=20)
    args = parser.parse_args()
    report: dict[str, object] = {}
    for kind in ("sqlite", "postgres"):
        report[f"pickup_latency_{kind}"] = bench_latency(kind, args.latency_jobs)
        print(f"pickup latency {kind}: {report[f'pickup_latency_{kind}']}", flush=True)
        report[f"identical_submissions_{kind}"] = bench_identical(kind)
        print(f"8 identical submissions {kind}: {report[f'identical_submissions_{kind}']}", flush=True)
    report["overhead"] = bench_overhead(args.builds)
    print(f"queue overhead: {report['overhead']}", flush=True)
    out = ROOT / "bench" / "results" / "queue.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
