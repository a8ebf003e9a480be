"""A fleet, simulated for real: six hosts as Linux network namespaces on one bridge (tests/netnskit.py),
a PostgreSQL catalog and an S3 server reachable at the bridge's address, 4 worker hosts each
advertising a different GPU class and 2 serving hosts. The GPU classes are a TEST-ONLY fingerprint
override (tests/fakehost/sitecustomize.py): no machine here has four GPU classes. Each host has a
home of its own (no shared folder): model bundles and engines travel through the bucket.

200 real TensorRT-RTX builds (50 tiny models x 4 GPU classes) go through the pool. The first job is a
`held_build` (a test-only job kind of tests/jobkinds_for_tests.py: a real build that waits between
building and publishing on its first attempt); the host that holds it is cut off (its link down at the
bridge). Its lease expires, another host takes the job over and publishes it; the cut-off host, its link
back, is refused: no job is lost or run twice, no blob is published twice (the bucket holds exactly the
blobs of the READY engines and of the models), no engine row is left PENDING. Then each serving host
pulls the engine of its GPU class (the alias `prod`) and starts from it: one with the catalog and the
store cut off (it pulled before), one with them reachable (its load event is recorded). Then the alias
moves under running serving processes (`PulledFollower`): `prod` promoted to a version 2 (built by the
pool for both serving classes), one `pull --watch` round on each serving host and one poll of its
serving process switch both to version 2's engine of their class; a rollback, one more round and poll
each, switches both back. Bounded by rounds, not timed. Last, a node cache (deploy/k8s/node-cache.yaml):
a folder a serving host pulls version 2 and then `prod` into with `--max-bytes` one engine's room, so
the second pull evicts the first engine; a serving process starts from it with the host cut off (no
download possible). The GPU side of
the serving start is a test-only fake runtime (nothing here runs a TensorRT engine); the read, the
verification against the manifest and the readiness state are the product's.

The test prints the pool's throughput and the takeover time; with ENGINECACHE_FLEET_REPORT=FILE it
also writes them there as JSON (bench/bench_fleet.py, `make bench`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.objectstore import blob_key
from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import request_payload, submit_build
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import promote, rollback
from tests.jobkinds_for_tests import ENV as TEST_JOB_KINDS
from tests.jobkinds_for_tests import HELD_PHASE
from tests.modelfactory import make_mlp
from tests.netnskit import Network
from tests.s3kit import GatedProxy, S3Server, wait_for
from tests.servingkit import ROOT, events

pytestmark = [pytest.mark.timeout(1500)]

# host -> the GPU class it advertises (test-only override)
WORKERS = {
    "worker-a100": "sm80:A100-SXM4-80GB",
    "worker-a6000": "sm86:RTX A6000",
    "worker-l4": "sm89:L4",
    "worker-5090": "sm120:RTX 5090",
}
SERVING = {"serve-a6000": "sm86:RTX A6000", "serve-l4": "sm89:L4"}
CLASSES = ("sm80", "sm86", "sm89", "sm120")  # TensorRT-RTX refuses FP32 GEMMs for SM75
MODELS = 50  # x 4 classes = 200 build jobs
LEASE_SECONDS = 6.0
FAKEHOST = Path(__file__).resolve().parent / "fakehost"
RUN_SECONDS = 900.0


def _gpu_class(spec: str) -> str:
    return spec.split(":", 1)[0]


class Fleet:
    """The network, the servers on the bridge and the environment a host's processes get."""

    def __init__(self, tmp_path: Path, pg_url: str) -> None:
        self.tmp = tmp_path
        self.network = Network([*WORKERS, *SERVING])
        self.s3 = S3Server(host=self.network.gateway)
        self.forwarder: GatedProxy | None = None
        self.prefix = f"fleet-{uuid.uuid4().hex[:10]}"
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self.release_file = tmp_path / "release-held-build"
        url = sa.make_url(pg_url)
        self.pg_url = pg_url
        # The machine's PostgreSQL listens on 127.0.0.1 only: a forwarder on the bridge reaches it.
        self.forwarder = GatedProxy(url.port or 5432, listen=self.network.gateway, target_host=url.host or "127.0.0.1")
        port = self.forwarder.port
        self.host_db_url = url.set(host=self.network.gateway, port=port).render_as_string(hide_password=False)

    def start_store(self) -> None:
        self.s3.start()

    def env(self, host: str, **extra: str) -> dict[str, str]:
        gpu = {**WORKERS, **SERVING}[host]
        base = {k: v for k, v in os.environ.items() if not k.startswith(("ENGINECACHE_", "AWS_"))}
        return {
            **base,
            **self.s3.env(self.prefix),
            "PYTHONPATH": str(FAKEHOST),
            "ENGINECACHE_TEST_FAKE_GPU": gpu,
            "ENGINECACHE_TEST_FAKE_GPU_RUNTIME": "1",  # a host with a GPU proves its builds load on it
            "ENGINECACHE_HOST_CACHE": "off",
            "ENGINECACHE_HOME": str(self.tmp / host),
            "ENGINECACHE_DB_URL": self.host_db_url,
            "ENGINECACHE_STORE_RETRY_SECONDS": "2",
            **extra,
        }

    def log(self, host: str) -> Path:
        return self.tmp / f"{host}.log"

    def start_worker(self, host: str) -> None:
        argv = [sys.executable, "-m", "enginecache.cli", "worker", "--name", host]
        argv += ["--lease-seconds", str(LEASE_SECONDS), "--poll-seconds", "0.2"]
        with open(self.log(host), "ab") as log:
            self.workers[host] = self.network.popen(
                host,
                argv,
                env=self.env(host, **TEST_JOB_KINDS),
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def run(self, host: str, argv: list[str], **extra: str) -> subprocess.CompletedProcess[str]:
        return self.network.run(
            host, argv, env=self.env(host, **extra), cwd=ROOT, capture_output=True, text=True, timeout=300
        )

    def close(self) -> None:
        for process in self.workers.values():
            if process.poll() is None:
                process.terminate()
        for process in self.workers.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=60)
        self.s3.stop()
        if self.forwarder is not None:
            self.forwarder.close()
        self.network.close()


@pytest.fixture
def fleet(tmp_path: Path, pg_url: str) -> Iterator[Fleet]:
    made = Fleet(tmp_path, pg_url)
    try:
        made.start_store()
        yield made
    finally:
        made.close()


def _jobs(app: AppContext) -> list[JobRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(JobRecord).order_by(col(JobRecord.id))).all())


def _engines(app: AppContext) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(EngineRecord).order_by(col(EngineRecord.id))).all())


def _until(condition: Callable[[], Any], what: str, seconds: float = RUN_SECONDS) -> Any:
    """Poll until `condition()` returns something true; that value."""
    found: list[Any] = []

    def check() -> bool:
        value = condition()
        if value:
            found.append(value)
        return bool(value)

    wait_for(check, what, seconds)
    return found[0]


def _submit(app: AppContext, fleet: Fleet, tmp_path: Path) -> int:
    """50 models registered (their bundles into the bucket), 200 jobs: the held one first."""
    names, ids = [], []
    for index in range(MODELS):
        name = f"fleet-mlp-{index:02d}"
        model = register_model(app, make_mlp(tmp_path / "models" / f"{name}.onnx", seed=index), name=name).model
        names.append(name)
        ids.append(model.id or 0)
    first = BuildRequest(model=names[0], backend="rtx", precision="fp32", targets=(CLASSES[0],))
    model_id = ids[0]
    payload = {**request_payload(first, model_id), "release_file": str(fleet.release_file), "hold_attempts": 1}
    held = queue.enqueue(app.catalog, kind="held_build", payload=payload, requirements={"backend": "rtx"}).job
    for name in names:
        for gpu_class in CLASSES:
            if (name, gpu_class) != (names[0], CLASSES[0]):
                submit_build(app, BuildRequest(model=name, backend="rtx", precision="fp32", targets=(gpu_class,)))
    return held.id or 0


def test_a_fleet_of_namespaced_hosts_builds_takes_over_a_cut_off_host_and_serves(
    fleet: Fleet, app_factory: Callable[..., AppContext], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in fleet.s3.env(fleet.prefix).items():
        monkeypatch.setenv(name, value)
    app = app_factory(home=tmp_path / "registry", db_url=fleet.pg_url)
    held_id = _submit(app, fleet, tmp_path)
    started = time.monotonic()
    for host in WORKERS:
        fleet.start_worker(host)

    def held() -> JobRecord | None:
        job = queue.get_job(app.catalog, held_id)
        return job if job.status == JobStatus.RUNNING and job.phase == HELD_PHASE else None

    victim = _until(held, "the held build to reach its publish").lease_owner
    assert victim in WORKERS
    fleet.network.cut(victim)
    cut_at = time.monotonic()

    def taken_over() -> JobRecord | None:
        job = queue.get_job(app.catalog, held_id)
        return job if job.attempts >= 2 and job.lease_owner not in (None, victim) else None

    taker = _until(taken_over, "another host to take the held build over").lease_owner
    takeover_seconds = time.monotonic() - cut_at
    assert _until(lambda: queue.get_job(app.catalog, held_id).status == JobStatus.SUCCEEDED, "the takeover build")

    def all_done() -> list[JobRecord] | None:
        jobs = _jobs(app)
        return jobs if all(j.status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD) for j in jobs) else None

    jobs = _until(all_done, "every job to end")
    pool_seconds = time.monotonic() - started

    # The cut-off host comes back and lets its held attempt go on: what it writes is refused.
    fleet.network.restore(victim)
    fleet.release_file.touch()
    rejected = f"job {held_id}"
    _until(
        lambda: any(
            rejected in line and "write rejected" in line for line in fleet.log(victim).read_text().splitlines()
        ),
        f"{victim} to be told its lease on job {held_id} is gone",
        120,
    )
    engines = _until(
        lambda: (rows := _engines(app)) and not any(e.status == EngineStatus.PENDING for e in rows) and rows,
        "no engine row PENDING",
        120,
    )

    # No job lost or run twice; one READY engine per job, built by the host that held its lease.
    assert len(jobs) == MODELS * len(CLASSES) == 200
    assert [j.id for j in jobs if j.status != JobStatus.SUCCEEDED] == []
    assert {j.id: j.attempts for j in jobs if j.attempts != 1} == {held_id: 2}
    ready = [e for e in engines if e.status == EngineStatus.READY]
    assert len(ready) == 200 == len({e.cache_key for e in ready}) == len({j.result_engine_id for j in jobs})
    held_engines = [e for e in engines if e.job_id == held_id]
    assert {(e.job_attempt, e.status) for e in held_engines} <= {(1, EngineStatus.FAILED), (2, EngineStatus.READY)}
    assert [e.host.get("hostname") for e in held_engines if e.status == EngineStatus.READY] != []
    assert {j.lease_owner for j in jobs if j.id == held_id} == {taker}, "the host that took it over finished it"
    assert {j.lease_owner for j in jobs} >= {taker}

    # No blob published twice: the bucket holds exactly the READY engines' blobs and the models' files.
    models_files = {
        str(sha) for model in _models(app) for sha, _size in (model.info.get("remote_files") or {}).values()
    }
    expected = {f"{fleet.prefix}/{blob_key(e.sha256 or '')}" for e in ready} | {
        f"{fleet.prefix}/{blob_key(sha)}" for sha in models_files
    }
    assert set(fleet.s3.keys(fleet.prefix)) == expected

    # Each serving host pulls the engine of its GPU class, then starts from it.
    promote(app, "fleet-mlp-00", "prod")
    served = {}
    for host, gpu in SERVING.items():
        dest = tmp_path / host / "engines"
        pulled = fleet.run(
            host, [sys.executable, "-m", "enginecache.cli", "pull", "fleet-mlp-00@prod", "--dest", str(dest), "--json"]
        )
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        manifest = json.loads(Path(json.loads(pulled.stdout)["manifest"]).read_text())
        assert manifest["engine"]["targets"] == [_gpu_class(gpu)], f"{host} pulled the engine of its GPU class"
        served[host] = (dest, manifest)
    before = len(events(app))
    starts = {}
    for host, (dest, manifest) in served.items():
        cut = host == "serve-a6000"
        if cut:
            fleet.network.cut(host)  # catalog and store unreachable: it pulled before
        starts[host] = _start(fleet, host, dest / "manifests" / "fleet-mlp-00.json", manifest)
        if cut:
            fleet.network.restore(host)
    recorded = events(app)[before:]
    assert [e.engine_id for e in recorded] == [served["serve-l4"][1]["engine"]["id"]], (
        "the reachable host's start is recorded; the cut-off one's could not be"
    )
    alias_moves = _alias_moves_reach_both_serving_hosts(fleet, app, tmp_path, served)
    node_cache = _a_node_cache_within_its_budget_serves_with_no_download(fleet, tmp_path, served)
    report = {
        "jobs": len(jobs),
        "workers": len(WORKERS),
        "pool_seconds": round(pool_seconds, 2),
        "jobs_per_second": round(len(jobs) / pool_seconds, 2),
        "takeover_seconds": round(takeover_seconds, 2),
        "lease_seconds": LEASE_SECONDS,
        "cut_host": victim,
        "taken_over_by": taker,
        "serving_start_seconds": starts,
        "alias_move_seconds": alias_moves,
        "node_cache": node_cache,
    }
    print(f"\nfleet: {json.dumps(report)}")
    if os.environ.get("ENGINECACHE_FLEET_REPORT"):
        Path(os.environ["ENGINECACHE_FLEET_REPORT"]).write_text(json.dumps(report, indent=2))


def _models(app: AppContext) -> list[Any]:
    from enginecache.db.models import ModelRecord

    with app.catalog.read() as session:
        return list(session.exec(select(ModelRecord)).all())


START = """
import json, subprocess, sys, time
started = time.perf_counter()
from enginecache import load_or_build
engine = load_or_build(sys.argv[1], spec=None, state_file=sys.argv[2])
seconds = time.perf_counter() - started
sha256 = engine.session.engine_sha256
print(json.dumps({"via": engine.via, "id": engine.engine_id, "sha256": sha256, "seconds": seconds}), flush=True)
probe = [sys.executable, "-m", "enginecache.cli", "ready", "--state", sys.argv[2]]
raise SystemExit(subprocess.run(probe).returncode)
"""


def _start(fleet: Fleet, host: str, manifest_file: Path, manifest: dict[str, Any]) -> float:
    """A serving process on `host` starts from its pulled folder (the GPU runtime faked, test-only);
    the readiness probe answers for it. Its start's wall seconds."""
    state = fleet.tmp / f"{host}-state.json"
    done = fleet.run(host, [sys.executable, "-c", START, str(manifest_file), str(state)])
    assert done.returncode == 0, done.stdout + done.stderr
    started = json.loads(done.stdout.strip().splitlines()[0])
    assert started["via"] == "pulled" and started["id"] == manifest["engine"]["id"]
    assert started["sha256"] == manifest["engine"]["sha256"], "the session got the pulled engine's verified bytes"
    return round(float(started["seconds"]), 3)


FOLLOW = """
import json, sys
from pathlib import Path
from enginecache.service.serving.follow import PulledFollower
follower = PulledFollower(Path(sys.argv[1]), state_file=sys.argv[2])
print(json.dumps({"outcome": "started", "sha256": follower.sha256}), flush=True)
for _line in sys.stdin:
    outcome = follower.poll()
    print(json.dumps({"outcome": outcome, "sha256": follower.sha256, "error": follower.last_error}), flush=True)
follower.close()
"""


def _poll(process: subprocess.Popen[str]) -> dict[str, Any]:
    """One poll of a following serving process: its outcome and the engine it serves."""
    assert process.stdin is not None and process.stdout is not None
    process.stdin.write("poll\n")
    process.stdin.flush()
    line = process.stdout.readline()
    assert line, f"the serving process ended (exit {process.poll()})"
    return dict(json.loads(line))


def _alias_moves_reach_both_serving_hosts(
    fleet: Fleet, app: AppContext, tmp_path: Path, served: dict[str, tuple[Path, dict[str, Any]]]
) -> dict[str, float]:
    """`prod` promoted to a version 2 and rolled back under a running serving process on each serving
    host: each move reaches both within one `pull --watch` round and one poll. Seconds from each move
    to both hosts serving its engine."""
    v2 = register_model(
        app, make_mlp(tmp_path / "models" / "fleet-mlp-00-v2.onnx", seed=1000), name="fleet-mlp-00", new_version=True
    ).model
    classes = sorted({_gpu_class(gpu) for gpu in SERVING.values()})
    for gpu_class in classes:
        submit_build(app, BuildRequest(model=str(v2.id), backend="rtx", precision="fp32", targets=(gpu_class,)))

    def v2_ready() -> dict[str, str] | None:
        rows = [e for e in _engines(app) if e.model_id == v2.id and e.status == EngineStatus.READY]
        by_class = {e.targets: str(e.sha256) for e in rows}
        return by_class if set(by_class) >= set(classes) else None

    v2_shas = _until(v2_ready, "version 2's engines for the serving classes", 300)
    followers: dict[str, subprocess.Popen[str]] = {}
    try:
        for host, (dest, manifest) in served.items():
            argv = [sys.executable, "-c", FOLLOW, str(dest / "manifests" / "fleet-mlp-00.json")]
            argv.append(str(fleet.tmp / f"{host}-follow-state.json"))
            process = fleet.network.popen(
                host, argv, env=fleet.env(host), cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
            followers[host] = process
            assert process.stdout is not None
            started = json.loads(process.stdout.readline() or "{}")
            assert started.get("sha256") == manifest["engine"]["sha256"], f"{host} serves version 1 first"
        seconds = {}
        for move, expected in (
            ("promote", {h: v2_shas[_gpu_class(g)] for h, g in SERVING.items()}),
            ("rollback", {h: served[h][1]["engine"]["sha256"] for h in SERVING}),
        ):
            moved = time.monotonic()
            if move == "promote":
                promote(app, "fleet-mlp-00", "prod", version=2)
            else:
                rollback(app, "fleet-mlp-00", "prod")
            for host, (dest, _manifest) in served.items():
                argv = [sys.executable, "-m", "enginecache.cli", "pull", "fleet-mlp-00@prod", "--dest", str(dest)]
                watched = fleet.run(host, [*argv, "--watch", "--rounds", "1", "--json"])
                assert watched.returncode == 0, watched.stdout + watched.stderr
                assert json.loads(watched.stdout.splitlines()[0])["switched"] is True, f"{move}: {host}'s round"
                polled = _poll(followers[host])
                assert (polled["outcome"], polled["sha256"]) == ("switched", expected[host]), f"{move}: {host}"
            seconds[move] = round(time.monotonic() - moved, 3)
        return seconds
    finally:
        for process in followers.values():
            if process.stdin is not None:
                process.stdin.close()
        for process in followers.values():
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=60)


def _a_node_cache_within_its_budget_serves_with_no_download(
    fleet: Fleet, tmp_path: Path, served: dict[str, tuple[Path, dict[str, Any]]]
) -> dict[str, Any]:
    """A node cache on serve-l4 kept within a budget of one engine and a half (the second pull evicts the
    engine the first one pulled, which no manifest names any more), then a serving start from it with the
    host's link down. What it holds and the start's seconds."""
    host = "serve-l4"
    manifest = served[host][1]
    cache = tmp_path / host / "node-cache"
    budget = int(manifest["engine"]["size_bytes"]) * 3 // 2
    pulls = []
    for ref in ("fleet-mlp-00@v2", "fleet-mlp-00@prod"):
        argv = [sys.executable, "-m", "enginecache.cli", "pull", ref, "--dest", str(cache)]
        done = fleet.run(host, [*argv, "--max-bytes", str(budget), "--json"])
        assert done.returncode == 0, done.stdout + done.stderr
        pulls.append(json.loads(done.stdout))
    assert pulls[1]["sha256"] == manifest["engine"]["sha256"]
    evicted = [blob["sha256"] for blob in pulls[1]["evicted"]["blobs"]]
    assert evicted == [pulls[0]["sha256"]], "the second pull made room by evicting the first engine"
    blobs = [p for p in (cache / "objects").rglob("*") if p.is_file()]
    held = sum(p.stat().st_size for p in blobs)
    assert [p.name for p in blobs] == [manifest["engine"]["sha256"]] and held <= budget, "within its budget"
    fleet.network.cut(host)  # no catalog, no store: nothing can be downloaded
    try:
        seconds = _start(fleet, host, cache / "manifests" / "fleet-mlp-00.json", manifest)
    finally:
        fleet.network.restore(host)
    return {"max_bytes": budget, "held_bytes": held, "start_seconds": seconds}
