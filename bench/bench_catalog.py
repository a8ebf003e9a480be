"""Catalog at scale: the cache-key point lookup and the miss explanation, on SQLite and PostgreSQL.

Seeds a catalog with bulk inserts (`executemany` on SQLite, `COPY` on PostgreSQL; no ORM adds): at
full scale 100,000 engines, 100,000 jobs, 1,000,000 load events, 5,000 test-load runs and 3 workers
over 50 models (--quick: 10,000 / 10,000 / 100,000 / 1,000 over 20). Model 1 ("hot_model") is a real
registered ONNX model with 2,000 engines (about 1,760 READY) whose key ingredients come from real
build plans (targets x precision x optimization level x workspace), so `find_engine` and
`explain_miss` run on the product's own plans. Rows are created in time order (ids grow with
created_at, as in a live catalog), then ANALYZE (PostgreSQL: VACUUM ANALYZE, as autovacuum would).

Then, through the product's own functions:

- `service.builds.plan.find_ready_engine(app, cache_key)` over 10,000 random keys of the catalog (READY or
  not): p50 / p99 / max, and the EXPLAIN of its statement (ix_engines_key_status must be used);
- `service.serving.lookup.find_engine` on misses of the hot model asked from an sm86 host (no engine has
  the key; the fallback scans for one whose key differs only in its target list), and on a hit that
  only the fallback finds; `service.serving.lookup.explain_miss` on the same misses: median / max.

    .venv/bin/python bench/bench_catalog.py [--quick] [--db sqlite|postgresql|both] [--out FILE]

Or through bench/run_all.py (`run(report)`, bench/harness.py; `report.options["catalog_db"]`
picks the databases). PostgreSQL: a dedicated database (`enginecache_bench_<random>`, created and
dropped here) on the server of ENGINECACHE_BENCH_PG (default postgresql://postgres@127.0.0.1:5432/postgres).
bench/bench_dashboard.py seeds through bench/catalog_seed.py (`seed_catalog`) and times the dashboard's views.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402
from catalog_db import (  # noqa: E402
    DATABASES,
    FULL,
    HOT_MODEL,
    QUICK,
    Scale,
    bench_catalog,
    load_average,
    log,
    server_version,
    write_results,
)
from catalog_seed import Seeded, seed_catalog, with_options  # noqa: E402

from enginecache.service.builds.plan import (  # noqa: E402
    BuildRequest,
    find_ready_engine,
    plan_build,
    ready_engine_query,
)
from enginecache.service.context import AppContext  # noqa: E402
from enginecache.service.serving.lookup import explain_miss, find_engine  # noqa: E402

SECTION = "Catalog at scale: cache-key lookup and miss explanation"
GOALS = {"point_lookup_p99_ms": {"sqlite": 1.0, "postgresql": 2.0}, "explain_miss_max_ms": 50.0}


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
        misses.append(with_options(base, options))
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
    return write_results(out, args.out)


if __name__ == "__main__":
    sys.exit(main())
