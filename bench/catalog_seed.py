"""bench_catalog's seeding: `seed_catalog` fills a catalog (bench/catalog_db.py) at a `Scale`.

Model 1 ("hot_model") is a real registered ONNX model whose engines' key ingredients come from real
build plans; the other models, engines, jobs, load events and test-load runs are bulk-inserted rows
in time order (see bench/bench_catalog.py's docstring for the figures).
"""

from __future__ import annotations

import itertools
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


from catalog_db import HOT_MODEL, PRECISIONS, BulkWriter, Scale, log  # noqa: E402

from enginecache.core.backends.registry import get_backend  # noqa: E402
from enginecache.core.cachekey import KEY_SCHEMA, compute_cache_key  # noqa: E402
from enginecache.core.fingerprint import GpuInfo, HostFingerprint, host_fingerprint  # noqa: E402
from enginecache.core.onnx_info import inspect_model  # noqa: E402
from enginecache.db import queue  # noqa: E402
from enginecache.service.builds.plan import BuildPlan, BuildRequest, plan_build  # noqa: E402
from enginecache.service.context import AppContext  # noqa: E402
from enginecache.service.jobs.routing import worker_capabilities  # noqa: E402
from enginecache.service.models.register import register_model  # noqa: E402
from tests.modelfactory import make_conv  # noqa: E402

# -- seeding ------------------------------------------------------------------------------------


def gpu_host(base: HostFingerprint, cc: str = "sm86") -> HostFingerprint:
    """A serving host with one NVIDIA GPU of compute capability `cc` (this machine has none)."""
    gpu = GpuInfo(
        index=0, name="NVIDIA RTX A6000", uuid="GPU-bench-0", compute_capability=cc, memory_total_bytes=48 * 2**30
    )
    return base.replace(hostname="bench-gpu", gpus=(gpu,))


@dataclass
class Seeded:
    """What the benchmarks need from the seeded catalog."""

    seconds: dict[str, float]
    counts: dict[str, int]
    host: HostFingerprint  # a GPU host (sm86) the hot model's misses are asked from
    hot_plans: list[BuildPlan] = field(default_factory=list)  # the hot model's engines' plans, in seed order


def _hot_plans(app: AppContext, host: HostFingerprint, count: int, rng: random.Random) -> list[BuildPlan]:
    """`count` distinct real plans of the hot model: target set x precision x opt level x workspace."""
    targets = get_backend("rtx").known_targets()
    target_sets = [(t,) for t in targets] + list(itertools.combinations(targets, 2))
    base = {
        (ts, precision): plan_build(
            app, BuildRequest(model=HOT_MODEL, backend="rtx", targets=ts, precision=precision), host=host
        )
        for ts in target_sets
        for precision in ("fp32", "fp16")
    }
    combos = [(k, level, ws) for k in base for level in (None, 0, 1, 2, 3, 4, 5) for ws in (None, 1, 2, 4, 8, 16, 32)]
    rng.shuffle(combos)
    plans = []
    for key, level, ws in combos[:count]:
        plan = base[key]
        options = {**plan.build_options, "opt_level": level, "workspace_bytes": ws * 2**30 if ws else None}
        plans.append(with_options(plan, options))
    return plans


def with_options(plan: BuildPlan, options: dict[str, Any]) -> BuildPlan:
    ingredients = {**plan.ingredients, "build_options": options}
    return replace(plan, build_options=options, ingredients=ingredients, cache_key=compute_cache_key(ingredients))


ENGINE_STATUSES = ["READY"] * 88 + ["FAILED"] * 6 + ["RETIRED"] * 3 + ["CORRUPT"] + ["PENDING"] * 2
JOB_STATUSES = ["SUCCEEDED"] * 90 + ["FAILED"] * 4 + ["DEAD"] + ["CANCELLED"] * 5
OUTCOMES = ["hit"] * 85 + ["miss"] * 5 + ["built"] * 6 + ["rejected"] * 2 + ["queued"] * 2


def _ages(rng: random.Random, n: int, span_s: int) -> list[int]:
    """Seconds before now, oldest first: rows are created in time order (ids grow with time)."""
    return sorted((rng.randint(0, span_s) for _ in range(n)), reverse=True)


def seed_catalog(app: AppContext, scale: Scale, *, seed: int = 7) -> Seeded:
    """Bulk-insert a catalog of `scale` into an empty, migrated one."""
    rng = random.Random(seed)
    writer = BulkWriter(app)
    seconds: dict[str, float] = {}
    now = datetime.now(UTC)
    local = host_fingerprint()
    build_host = local.to_dict()
    build_host_json = json.dumps(build_host)
    serving = gpu_host(local)
    day = 86400

    started = time.perf_counter()
    hot_path = make_conv(app.home / "seed" / "convnet.onnx")
    hot = register_model(app, hot_path, name=HOT_MODEL).model
    assert hot.id == 1, "seed an empty catalog"
    info = inspect_model(hot_path).to_dict()
    writer.insert(
        "models",
        (
            {
                "name": f"model_{i:03d}",
                "digest": f"{i:064x}",
                "filename": "model.onnx",
                "store_path": f"models/{i:064x}/model.onnx",
                "size_bytes": rng.randint(1, 500) * 2**20,
                "info": {**info, "digest": f"{i:064x}"},
                "parent_id": None,
                "recipe": {},
                "recipe_key": None,
                "created_at": now - timedelta(days=90, minutes=i),
            }
            for i in range(2, scale.models + 1)
        ),
    )
    plans = _hot_plans(app, serving, scale.hot_engines, rng)
    seconds["models"] = time.perf_counter() - started

    started = time.perf_counter()
    targets = get_backend("rtx").known_targets()
    version = plans[0].backend_version
    hot_rows = set(rng.sample(range(scale.engines), scale.hot_engines))
    hot_iter = iter(plans)
    profile = {"input": {"min": [1, 3, 32, 32], "opt": [1, 3, 32, 32], "max": [8, 3, 32, 32]}}
    io = json.dumps([{"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 3, 32, 32]}])
    engine_ages = _ages(rng, scale.engines, 60 * day)

    def engines() -> Iterator[dict[str, Any]]:
        for i, age in enumerate(engine_ages):
            status = rng.choice(ENGINE_STATUSES)
            if i in hot_rows:
                plan = next(hot_iter)
                model_id, ingredients = 1, plan.ingredients
                precision, target_list = plan.precision.precision, plan.targets
            else:
                model_id = rng.randint(2, scale.models)
                precision, target_list = rng.choice(PRECISIONS), (rng.choice(targets),)
                ingredients = {
                    "schema": KEY_SCHEMA,
                    "onnx_digest": f"{model_id:064x}",
                    "precision": {"name": precision, "tool": "none", "tool_version": None, "calibration_digest": None},
                    "build_options": {
                        "profiles": profile,
                        "opt_level": i,
                        "workspace_bytes": None,
                        "strongly_typed": True,
                    },
                    "backend": "rtx",
                    "backend_version": version,
                    "target": {"compute_capabilities": list(target_list)},
                    "os": "Linux",
                }
            created = now - timedelta(seconds=age)
            ready = status in ("READY", "RETIRED", "CORRUPT")
            sha = f"{i:064x}" if ready else None
            yield {
                "model_id": model_id,
                "variant_model_id": None,
                "backend": "rtx",
                "backend_version": version,
                "precision": precision,
                "targets": ",".join(target_list),
                "cache_key": compute_cache_key(ingredients),
                "status": status,
                "onnx_digest": ingredients["onnx_digest"],
                "key_ingredients": ingredients,
                "precision_recipe": ingredients["precision"],
                "build_options": ingredients["build_options"],
                "target_info": ingredients["target"],
                "os": "Linux",
                "host": build_host_json,
                "io": io,
                "warnings": [],
                "sha256": sha,
                "blake3": sha,
                "size_bytes": rng.randint(1, 400) * 2**20 if ready else None,
                "blob_path": f"objects/sha256/{sha[:2]}/{sha}" if sha else None,
                "build_seconds": rng.uniform(0.5, 600.0) if ready else None,
                "builder_log": "[phase] Building engine\n" * 20,
                "error": "TensorRT: network has dynamic shapes but no profile" if status == "FAILED" else None,
                "created_at": created,
                "finished_at": created + timedelta(seconds=30),
                "verified_at": None,
                "job_id": i + 1,
                "job_attempt": 1,
            }

    writer.insert("engines", engines())
    seconds["engines"] = time.perf_counter() - started

    started = time.perf_counter()
    job_ages = _ages(rng, scale.jobs, 60 * day)

    def jobs() -> Iterator[dict[str, Any]]:
        for i, age in enumerate(job_ages):
            active = i >= scale.jobs - 25
            status = ("QUEUED" if i < scale.jobs - 5 else "RUNNING") if active else rng.choice(JOB_STATUSES)
            created = now - timedelta(seconds=age)
            terminal = status not in ("QUEUED", "RUNNING")
            yield {
                "kind": "build",
                "status": status,
                "idempotency_key": None if terminal else f"{i:064x}",
                "payload": {
                    "model": str(rng.randint(1, scale.models)),
                    "backend": "rtx",
                    "precision": rng.choice(PRECISIONS),
                    "targets": [rng.choice(targets)],
                    "profiles": [],
                },
                "requirements": '{"backend": "rtx"}',
                "attempts": 1,
                "max_attempts": 3,
                "timeout_seconds": 3600.0,
                "lease_owner": "worker-0" if status == "RUNNING" else None,
                "cancel_requested": False,
                "progress": rng.random() if status == "RUNNING" else (1.0 if status == "SUCCEEDED" else 0.0),
                "phase": "Building engine" if status == "RUNNING" else None,
                "log_tail": "",
                "error": "attempt 1 failed: child killed by SIGKILL" if status in ("FAILED", "DEAD") else None,
                "result_engine_id": rng.randint(1, scale.engines) if status == "SUCCEEDED" else None,
                "run_after": created,
                "created_at": created,
                "started_at": created if status != "QUEUED" else None,
                "finished_at": created + timedelta(seconds=rng.randint(1, 900)) if terminal else None,
                "updated_at": created,
            }

    writer.insert("jobs", jobs())
    seconds["jobs"] = time.perf_counter() - started

    started = time.perf_counter()
    hostnames = [f"serve-{h:02d}" for h in range(20)]
    names = [HOT_MODEL] + [f"model_{i:03d}" for i in range(2, scale.models + 1)]
    phases = json.dumps({"lookup": 0.002, "read_verify": 0.01, "validity": 0.001, "deserialize": 0.05})

    def events() -> Iterator[dict[str, Any]]:
        for age in _ages(rng, scale.events, 90 * day):
            model_id = rng.randint(1, scale.models)
            outcome = rng.choice(OUTCOMES)
            source = "build_request" if rng.random() < 0.1 else "load_or_build"
            if source == "build_request":
                outcome = "hit" if outcome in ("hit", "miss") else "queued"
            yield {
                "hostname": rng.choice(hostnames),
                "model_name": names[model_id - 1],
                "model_id": model_id,
                "engine_id": rng.randint(1, scale.engines) if outcome == "hit" else None,
                "backend": "rtx",
                "precision": "fp16",
                "host_target": "sm86",
                "outcome": outcome,
                "source": source,
                "reason": "",
                "lookup_s": 0.002,
                "read_verify_s": 0.01,
                "load_s": 0.05,
                "build_s": None,
                "total_s": rng.uniform(0.01, 0.2) if outcome == "hit" else rng.uniform(0.01, 300.0),
                "stat_cache_hit": True,
                "phases": phases,
                "created_at": now - timedelta(seconds=age),
            }

    writer.insert("load_events", events())
    seconds["load_events"] = time.perf_counter() - started

    started = time.perf_counter()
    samples = json.dumps([round(rng.uniform(0.4, 0.6), 4) for _ in range(100)])

    def runs() -> Iterator[dict[str, Any]]:
        for age in _ages(rng, scale.load_runs, 30 * day):
            engine_id = rng.randint(1, scale.engines)
            yield {
                "engine_id": engine_id,
                "model_id": rng.randint(1, scale.models),
                "job_id": None,
                "backend": "rtx",
                "precision": "fp16",
                "targets": rng.choice(targets),
                "hostname": rng.choice(hostnames),
                "host_target": "sm86",
                # FAIL only on older engines: the Engines view opens the newest, and a FAIL is shown as an error
                "verdict": rng.choice(["PASS"] * 9 + ["FAIL"]) if engine_id < scale.engines - 1000 else "PASS",
                "reason": "",
                "read_verify_s": 0.01,
                "validity_s": 0.001,
                "deserialize_s": 0.05,
                "create_context_s": 0.002,
                "allocate_io_s": 0.001,
                "first_inference_s": 0.003,
                "load_s": 0.06,
                "iterations": 100,
                "batch": 1,
                "p50_ms": 0.5,
                "p90_ms": 0.55,
                "p99_ms": 0.6,
                "mean_ms": 0.51,
                "throughput": 1900.0,
                "samples_ms": samples,
                "accuracy": [],
                "tolerances": {},
                "input_shapes": {},
                "details": {},
                "created_at": now - timedelta(seconds=age),
            }

    writer.insert("load_runs", runs())
    seconds["load_runs"] = time.perf_counter() - started

    for w in range(3):
        queue.register_worker(
            app.catalog,
            name=f"worker-{w}",
            hostname=f"host-{w}",
            pid=1000 + w,
            fingerprint=build_host,
            capabilities=worker_capabilities(local),
        )
    started = time.perf_counter()
    writer.analyze()
    seconds["analyze"] = time.perf_counter() - started
    counts = {
        "models": scale.models,
        "engines": scale.engines,
        "jobs": scale.jobs,
        "load_events": scale.events,
        "load_runs": scale.load_runs,
        "hot_model_engines": scale.hot_engines,
        "workers": 3,
    }
    log(f"seeded in {sum(seconds.values()):.1f} s: " + ", ".join(f"{k} {s:.1f} s" for k, s in seconds.items()))
    return Seeded(seconds={k: round(s, 2) for k, s in seconds.items()}, counts=counts, host=serving, hot_plans=plans)
