"""Catalog at scale: the cache-key point lookup and the miss explanation, on SQLite and PostgreSQL.

Seeds a catalog with bulk inserts (`executemany` on SQLite, `COPY` on PostgreSQL; no ORM adds): at
full scale 100,000 engines, 100,000 jobs, 1,000,000 load events, 5,000 test-load runs and 3 workers
over 50 models (--quick: 10,000 / 10,000 / 100,000 / 1,000 over 20). Model 1 ("hot_model") is a real
registered ONNX model with 2,000 engines (about 1,760 READY) whose key ingredients come from real
build plans (targets x precision x optimization level x workspace), so `find_engine` and
`explain_miss` run on the product's own plans. Rows are created in time order (ids grow with
created_at, as in a live catalog), then ANALYZE (PostgreSQL: VACUUM ANALYZE, as autovacuum would).

Then, through the product's own functions:

- `service.builds.find_ready_engine(app, cache_key)` over 10,000 random keys of the catalog (READY or
  not): p50 / p99 / max, and the EXPLAIN of its statement (ix_engines_key_status must be used);
- `service.lookup.find_engine` on misses of the hot model asked from an sm86 host (no engine has
  the key; the fallback scans for one whose key differs only in its target list), and on a hit that
  only the fallback finds; `service.lookup.explain_miss` on the same misses: median / max.

    .venv/bin/python bench/bench_catalog.py [--quick] [--db sqlite|postgresql|both] [--out FILE]

Or through bench/run_all.py (`run(report)`, bench/harness.py; `report.options["catalog_db"]`
picks the databases). PostgreSQL: a dedicated database (`enginecache_bench_<random>`, created and
dropped here) on the server of ENGINECACHE_BENCH_PG (default postgresql://postgres@127.0.0.1:5432/postgres).
bench/bench_dashboard.py seeds through `seed_catalog` here and times the dashboard's views.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from enginecache.core.backends.registry import get_backend  # noqa: E402
from enginecache.core.cachekey import KEY_SCHEMA, compute_cache_key  # noqa: E402
from enginecache.core.fingerprint import GpuInfo, HostFingerprint, host_fingerprint  # noqa: E402
from enginecache.core.onnx_info import inspect_model  # noqa: E402
from enginecache.db import queue  # noqa: E402
from enginecache.db.catalog import sqlite_url  # noqa: E402
from enginecache.service.builds import (  # noqa: E402
    BuildPlan,
    BuildRequest,
    find_ready_engine,
    plan_build,
    ready_engine_query,
)
from enginecache.service.context import AppContext  # noqa: E402
from enginecache.service.lookup import explain_miss, find_engine  # noqa: E402
from enginecache.service.models import register_model  # noqa: E402
from enginecache.service.routing import worker_capabilities  # noqa: E402
from tests.modelfactory import make_conv  # noqa: E402

SECTION = "Catalog at scale: cache-key lookup and miss explanation"
DATABASES = ("sqlite", "postgresql")
PG_ADMIN_URL = os.environ.get("ENGINECACHE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_BENCH_DB = "enginecache_bench"
BATCH = 20_000
HOT_MODEL = "hot_model"
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")
GOALS = {"point_lookup_p99_ms": {"sqlite": 1.0, "postgresql": 2.0}, "explain_miss_max_ms": 50.0}


@dataclass(frozen=True)
class Scale:
    name: str
    models: int
    engines: int
    jobs: int
    events: int
    load_runs: int
    hot_engines: int  # engines of model 1, the real model the miss figures ask about
    lookups: int
    misses: int


FULL = Scale(
    "full",
    50,
    engines=100_000,
    jobs=100_000,
    events=1_000_000,
    load_runs=5_000,
    hot_engines=2_000,
    lookups=10_000,
    misses=30,
)
QUICK = Scale(
    "quick",
    20,
    engines=10_000,
    jobs=10_000,
    events=100_000,
    load_runs=1_000,
    hot_engines=2_000,
    lookups=10_000,
    misses=30,
)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# -- the catalog: a temp SQLite file or a dedicated PostgreSQL database ---------------------------


def _pg_url(database: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + database


def _pg_admin(statement: str) -> None:
    url = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    admin = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(statement)
    finally:
        admin.dispose()


@contextlib.contextmanager
def bench_catalog(db: str, scratch: Path) -> Iterator[AppContext]:
    """An empty, migrated catalog on `db` ("sqlite" or "postgresql"), removed afterwards. On
    PostgreSQL a database of its own, `enginecache_bench_<random>`: a name used before in this process
    would count as migrated already (the catalog migrates a URL once per process)."""
    home = scratch / f"home-{db}-{uuid.uuid4().hex[:8]}"
    database = f"{PG_BENCH_DB}_{uuid.uuid4().hex[:8]}"
    if db == "sqlite":
        app = AppContext.from_settings(home, sqlite_url(home / "catalog.db"))
    elif db == "postgresql":
        _pg_admin(f"CREATE DATABASE {database}")
        app = AppContext.from_settings(home, _pg_url(database))
    else:
        raise ValueError(f"unknown database {db!r}")
    try:
        app.catalog  # noqa: B018 - opening it migrates it
        yield app
    finally:
        app.close()
        if db == "postgresql":
            _pg_admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def server_version(app: AppContext) -> str:
    with app.catalog.engine.connect() as conn:
        if app.catalog.is_sqlite:
            return "SQLite " + str(conn.exec_driver_sql("select sqlite_version()").scalar())
        return str(conn.exec_driver_sql("select version()").scalar()).split(" on ")[0]


# -- bulk inserts -------------------------------------------------------------------------------


# A table's indexes that no constraint owns (those can be dropped and created again), with their DDL.
_PG_SECONDARY_INDEXES = """
SELECT i.relname, pg_get_indexdef(i.oid) FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relname = %s AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.oid)
"""
_PLAIN = frozenset({str, int, float, type(None)})  # passed as they are (bool is not int here: type())


class BulkWriter:
    """Rows straight to the driver: `executemany` in one transaction per batch (SQLite), `COPY`
    (PostgreSQL). A row is a dict of column -> Python value; `insert` converts (dicts and lists to
    JSON text, datetimes to SQLAlchemy's SQLite text or aware datetimes, booleans to 0/1 on SQLite).
    A value the same for every row can be given as JSON text already (`json.dumps` once)."""

    def __init__(self, app: AppContext) -> None:
        self.app = app
        self.sqlite = app.catalog.is_sqlite

    def _value(self, v: Any) -> Any:
        kind = type(v)
        if kind in _PLAIN:
            return v
        if kind is datetime:  # UTCDateTime keeps naive UTC text on SQLite
            if not self.sqlite:
                return v
            return (v if v.tzinfo is UTC else v.astimezone(UTC)).replace(tzinfo=None).isoformat(" ", "microseconds")
        if kind is bool:
            return int(v) if self.sqlite else v
        if kind is dict or kind is list:
            return json.dumps(v)
        return v

    def insert(self, table: str, rows: Iterable[Mapping[str, Any]]) -> int:
        """Insert `rows` (all with the first row's columns); returns how many. The table's secondary
        indexes are dropped first and built again after (exactly as they were defined): one sort
        per index instead of a million random index inserts."""
        it = iter(rows)
        first = next(it, None)
        if first is None:
            return 0
        columns = list(first)
        tuples = (tuple(self._value(row[c]) for c in columns) for row in itertools.chain([first], it))
        count = 0
        raw = self.app.catalog.engine.raw_connection()
        try:
            if self.sqlite:
                sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
                cursor = raw.cursor()
                indexes = cursor.execute(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
                    (table,),
                ).fetchall()
                # Seeding only: no fsync per batch and a page cache that holds what is being
                # written; the catalog's own settings (synchronous=FULL) are back for the benchmarks.
                cursor.execute("PRAGMA synchronous=OFF")
                cursor.execute("PRAGMA cache_size=-262144")
                for name, _ in indexes:
                    cursor.execute(f"DROP INDEX {name}")
                while batch := list(itertools.islice(tuples, BATCH)):
                    cursor.execute("BEGIN IMMEDIATE")
                    cursor.executemany(sql, batch)
                    cursor.execute("COMMIT")
                    count += len(batch)
                for _, definition in indexes:
                    cursor.execute(definition)
                cursor.execute("PRAGMA synchronous=FULL")
                cursor.execute("PRAGMA cache_size=-2000")
                cursor.close()
            else:
                conn = raw.driver_connection
                assert conn is not None
                indexes = conn.execute(_PG_SECONDARY_INDEXES, (table,)).fetchall()
                for name, _ in indexes:
                    conn.execute(f'DROP INDEX "{name}"')
                statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"
                with conn.cursor() as cursor, cursor.copy(statement) as copy:
                    for row in tuples:
                        copy.write_row(row)
                        count += 1
                conn.execute("SET maintenance_work_mem = '256MB'")
                for _, definition in indexes:
                    conn.execute(definition)
                conn.commit()
        finally:
            raw.close()
        return count

    def analyze(self) -> None:
        """Planner statistics, as a live catalog has them (PostgreSQL: VACUUM too, which autovacuum
        runs after bulk inserts and which index-only scans need)."""
        raw = self.app.catalog.engine.raw_connection()
        try:
            if self.sqlite:
                raw.cursor().execute("ANALYZE")
            else:
                conn = raw.driver_connection
                assert conn is not None
                conn.commit()
                conn.autocommit = True
                conn.execute("VACUUM ANALYZE")
                conn.autocommit = False
        finally:
            raw.close()


# -- seeding ------------------------------------------------------------------------------------


def gpu_host(base: HostFingerprint, cc: str = "sm86") -> HostFingerprint:
    """A serving host with one NVIDIA GPU of compute capability `cc` (this machine has none)."""
    gpu = GpuInfo(
        index=0, name="NVIDIA RTX A6000", uuid="GPU-bench-0", compute_capability=cc, memory_total_bytes=48 * 2**30
    )
    return replace(base, hostname="bench-gpu", gpus=(gpu,))


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
        plans.append(_with_options(plan, options))
    return plans


def _with_options(plan: BuildPlan, options: dict[str, Any]) -> BuildPlan:
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


# -- figures ------------------------------------------------------------------------------------


def _ms(values: Sequence[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered) * 1e3, 4),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1e3, 4),
        "max_ms": round(ordered[-1] * 1e3, 4),
        "n": len(ordered),
    }


def explain(app: AppContext, statement: Any) -> list[str]:
    """The plan the database chooses for `statement` (EXPLAIN QUERY PLAN; PostgreSQL: EXPLAIN ANALYZE)."""
    engine = app.catalog.engine
    sql = str(statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    prefix = "EXPLAIN QUERY PLAN " if app.catalog.is_sqlite else "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) "
    with engine.connect() as conn:
        return [str(row[-1]) for row in conn.exec_driver_sql(prefix + sql)]


def bench_point_lookup(app: AppContext, scale: Scale, rng: random.Random) -> dict[str, Any]:
    """`find_ready_engine` over random cache keys of the catalog (a few are not READY: misses)."""
    ids = rng.sample(range(1, scale.engines + 1), min(scale.lookups, scale.engines))
    query = sa.text("SELECT cache_key FROM engines WHERE id IN :ids").bindparams(sa.bindparam("ids", expanding=True))
    with app.catalog.read() as session:
        keys = [str(k) for k in session.execute(query, {"ids": ids}).scalars()]
    rng.shuffle(keys)
    for key in keys[:200]:  # the pool's connection and the statement cache warm
        find_ready_engine(app, key)
    times, hits = [], 0
    for key in keys:
        started = time.perf_counter()
        found = find_ready_engine(app, key)
        times.append(time.perf_counter() - started)
        hits += found is not None
    plan = explain(app, ready_engine_query().params(cache_key=keys[0]))
    return {**_ms(times), "ready_hits": hits, "explain": plan}


def bench_miss(app: AppContext, seeded: Seeded, scale: Scale, rng: random.Random) -> dict[str, Any]:
    """Misses of the hot model asked from an sm86 host: `find_engine` (exact key absent, then the
    fallback scan) and `explain_miss`, each on `scale.misses` plans no engine was built for; and
    `find_engine` where only the fallback finds the engine."""
    built = {p.cache_key for p in seeded.hot_plans}
    misses = []
    for n in range(scale.misses):
        base = seeded.hot_plans[n % 10]
        options = {**base.build_options, "workspace_bytes": (1001 + 2 * n) * 2**20}  # never a built one's
        misses.append(_with_options(base, options))
        assert misses[-1].cache_key not in built
    explain_miss(app, misses[0], seeded.host)  # warm-up
    find_times, miss_times, found, message = [], [], 0, ""
    for plan in misses:
        started = time.perf_counter()
        found += find_engine(app, plan, seeded.host) is not None
        find_times.append(time.perf_counter() - started)
        started = time.perf_counter()
        message = str(explain_miss(app, plan, seeded.host))
        miss_times.append(time.perf_counter() - started)
    # An unbuilt plan for sm86 alone whose options a READY engine for sm86 and another target has.
    fallback: dict[str, Any] = {}
    for multi in (p for p in seeded.hot_plans if len(p.targets) > 1 and "sm86" in p.targets):
        request = BuildRequest(
            model=HOT_MODEL,
            backend="rtx",
            targets=("sm86",),
            precision=multi.precision.precision,
            opt_level=multi.build_options["opt_level"],
            workspace_bytes=multi.build_options["workspace_bytes"],
        )
        single = plan_build(app, request, host=seeded.host)
        if single.cache_key in built or find_ready_engine(app, multi.cache_key) is None:
            continue
        times, engine = [], None
        for _ in range(scale.misses):
            started = time.perf_counter()
            engine = find_engine(app, single, seeded.host)
            times.append(time.perf_counter() - started)
        fallback = {**_ms(times), "engine_targets": engine.targets if engine is not None else None}
        break
    return {
        "hot_model_engines": seeded.counts["hot_model_engines"],
        "find_engine_miss": {**_ms(find_times), "found": found},
        "find_engine_fallback_hit": fallback,
        "explain_miss": {
            "median_ms": round(statistics.median(miss_times) * 1e3, 3),
            "max_ms": round(max(miss_times) * 1e3, 3),
            "n": len(miss_times),
            "message": message,
        },
    }


def measure_catalog(app: AppContext, seeded: Seeded, scale: Scale) -> dict[str, Any]:
    """The point lookup and the miss figures on a seeded catalog."""
    db = "sqlite" if app.catalog.is_sqlite else "postgresql"
    rng = random.Random(11)
    load_before = load_average()
    lookup = bench_point_lookup(app, scale, rng)
    log(
        f"[{db}] find_ready_engine over {lookup['n']:,} keys: p50 {lookup['p50_ms']:.3f} ms, "
        f"p99 {lookup['p99_ms']:.3f} ms, max {lookup['max_ms']:.3f} ms; plan: {' | '.join(lookup['explain'][:3])}"
    )
    miss = bench_miss(app, seeded, scale, rng)
    em, fm, fb = miss["explain_miss"], miss["find_engine_miss"], miss["find_engine_fallback_hit"]
    log(
        f"[{db}] {miss['hot_model_engines']:,} engines of the model: explain_miss median {em['median_ms']:.1f} ms, "
        f"max {em['max_ms']:.1f} ms; find_engine on a miss p50 {fm['p50_ms']:.1f} ms, max {fm['max_ms']:.1f} ms; "
        f"on a fallback hit p50 {fb.get('p50_ms', float('nan')):.1f} ms"
    )
    return {"point_lookup": lookup, "miss": miss, "loadavg": {"before": load_before, "after": load_average()}}


def goals_met(results: Mapping[str, Any]) -> dict[str, bool]:
    met = {}
    for db, figures in results.items():
        p99, limit = figures["point_lookup"]["p99_ms"], GOALS["point_lookup_p99_ms"][db]
        met[f"{db}: find_ready_engine p99 {p99:.2f} ms < {limit:g} ms"] = p99 < limit
        worst = figures["miss"]["explain_miss"]["max_ms"]
        met[f"{db}: explain_miss max {worst:.1f} ms < {GOALS['explain_miss_max_ms']:g} ms"] = (
            worst < GOALS["explain_miss_max_ms"]
        )
    return met


def run(report: Any, *, databases: Sequence[str] | None = None) -> dict[str, Any]:
    """bench/run_all.py's entry point (a bench/harness.py Report: its `quick`, `scratch` and
    `options["catalog_db"]`). Files the figures as the section's `results` (in-process figures,
    not new processes) with `goals_met`, and returns them."""
    quick = bool(getattr(report, "quick", False))
    scale = QUICK if quick else FULL
    options = getattr(report, "options", None) or {}
    databases = tuple(databases or options.get("catalog_db") or DATABASES)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="enginecache-bench-catalog-", dir=getattr(report, "scratch", None)) as tmp:
        for db in databases:
            with bench_catalog(db, Path(tmp)) as app:
                seeded = seed_catalog(app, scale)
                results[db] = {
                    "server": server_version(app),
                    "seed_seconds": seeded.seconds,
                    "catalog": seeded.counts,
                    **measure_catalog(app, seeded, scale),
                }
    out = {
        "scale": asdict(scale),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "goals": GOALS,
        "results": results,
        "goals_met": goals_met(results),
    }
    if hasattr(report, "section"):
        report.section(
            SECTION,
            f"`find_ready_engine` over {scale.lookups:,} random keys and `find_engine` / `explain_miss` on "
            f"misses of a model with {scale.hot_engines:,} engines, in a catalog of {scale.engines:,} engines, "
            f"{scale.jobs:,} jobs and {scale.events:,} load events (bench/bench_catalog.py), on "
            + " and ".join(r["server"] for r in results.values())
            + ".",
            notes="In-process timings (perf_counter around each call), not new processes; load averages in the JSON.",
        )
        report.sections[SECTION]["results"] = out
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=str(__doc__).splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK.engines:,} engines, {QUICK.events:,} events")
    parser.add_argument("--db", choices=(*DATABASES, "both"), default="both")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "catalog.json")
    args = parser.parse_args()
    report = argparse.Namespace(quick=args.quick, scratch=None, options={})
    out = run(report, databases=DATABASES if args.db == "both" else (args.db,))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    for goal, met in out["goals_met"].items():
        log(f"{'met' if met else 'NOT MET'}: {goal}")
    log(f"wrote {args.out}")
    return 0 if all(out["goals_met"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
