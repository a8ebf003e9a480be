"""CLI benchmark: each command as a user meets it, in a NEW PROCESS, beside its floor.

Figures (bench/harness.py: one warm-up, then interleaved pairs, min / median, CPU, peak RSS, load):

- start-up: `enginecache --help`, `enginecache model --help` and each read command (`model list`,
  `model show`, `engine list`, `engine list --json`, `engine show`, `jobs`, `job show`, `fingerprint`)
  on a small catalog (one model, two engines, two jobs), against the interpreter floor
  `python -c pass`. Goal (issue): under 0.3 s wall each.
- one-shot build: `enginecache build` of a small model on a cache miss (nothing else running: the
  command runs the job on its own one-shot worker), against the same floor; each sample's recorded
  `build_seconds` (read from the catalog after it) is kept in the sample's `extra`, and the figure's
  `params` give the overhead per sample, wall - build_seconds. Goal: at most 1 s. Before each sample
  the previous engine is RETIRED (outside the timing), so every sample is a miss.
- listing at scale: `engine list --json`, `engine list` (the text table) and `jobs --json` over
  100,000 engines and 100,000 jobs (--quick: 10,000), on SQLite and on PostgreSQL, against raw SQL +
  json: a script that runs the same SELECT with the DBAPI alone (sqlite3 / psycopg), builds the same
  dicts and writes the same bytes (checked once, outside the timing). Goals: at most 2x the floor,
  peak RSS under 300 MB.

Catalogs are seeded with bulk inserts straight to the driver (no ORM). PostgreSQL: a database of its
own (created and dropped here) on ENGINECACHE_BENCH_PG (default postgresql://postgres@127.0.0.1:5432/
test, the admin connection); skipped with a note when the server cannot be reached.

    .venv/bin/python bench/bench_cli.py [--quick] [--pairs 5] [--only startup,build,listing] [--db sqlite,postgresql]

or through bench/run_all.py (`run(report)`; `report.options["cli_parts"]` and `["cli_db"]` pick parts
and databases). Writes bench/results/cli.json when run alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for _path in (ROOT, BENCH):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from harness import Command, Report, _figure, machine_info, run_once  # noqa: E402

SECTION_STARTUP = "CLI start-up and read commands"
SECTION_BUILD = "CLI one-shot build"
SECTION_LISTING = "CLI listing at scale"
PG_ADMIN_URL = os.environ.get("ENGINECACHE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
STARTUP_GOAL_S = 0.3
BUILD_OVERHEAD_GOAL_S = 1.0
LISTING_GOAL_RATIO = 2.0
LISTING_RSS_GOAL_BYTES = 300 * 2**20
FULL_ROWS = 100_000
QUICK_ROWS = 10_000
BATCH = 10_000
SHARED_MODEL = ROOT.parent / "shared" / "models" / "mobilenet_v3_small.onnx"
PARTS = ("startup", "build", "listing")
DATABASES = ("sqlite", "postgresql")


def cli_argv() -> list[str]:
    """The `enginecache` console script beside this interpreter (as a user runs it), else `-m`."""
    script = Path(sys.executable).parent / "enginecache"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "enginecache.cli"]


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


FLOOR_PASS = Command("python -c pass", [sys.executable, "-c", "pass"])


def run_cli(home: Path, *args: str, db_url: str | None = None) -> str:
    """Run the CLI (setup steps, not timed); its stdout."""
    env = {**os.environ, "ENGINECACHE_HOME": str(home)}
    if db_url:
        env["ENGINECACHE_DB_URL"] = db_url
    done = subprocess.run([*cli_argv(), *args], capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"enginecache {' '.join(args)}: exit {done.returncode}\n{done.stderr[-2000:]}")
    return done.stdout


def small_model(folder: Path) -> Path:
    """mobilenet_v3_small from ../shared/models where it is, else a small MLP made here."""
    if SHARED_MODEL.is_file():
        return SHARED_MODEL
    from tests.modelfactory import make_mlp

    return make_mlp(folder / "mlp.onnx")


# -- start-up and read commands -------------------------------------------------------------


def bench_startup(report: Report, scratch: Path) -> None:
    home = scratch / "small"
    model = small_model(scratch)
    run_cli(home, "model", "add", str(model), "--name", "small")
    run_cli(home, "build", "small", "--backend", "ort")
    built = json.loads(run_cli(home, "build", "small", "--backend", "rtx", "--target", "sm86", "--json"))
    env = {"ENGINECACHE_HOME": str(home)}
    cli = cli_argv()
    commands = [
        ("--help", ["--help"]),
        ("model --help", ["model", "--help"]),
        ("model list", ["model", "list"]),
        ("model show", ["model", "show", "small"]),
        ("engine list", ["engine", "list"]),
        ("engine list --json", ["engine", "list", "--json"]),
        ("engine show", ["engine", "show", str(built["id"])]),
        ("jobs", ["jobs"]),
        ("job show", ["job", "show", "1"]),
        ("fingerprint", ["fingerprint"]),
    ]
    report.section(
        SECTION_STARTUP,
        "Each command in a new process on a small catalog (one model, two engines, two finished jobs; "
        f"ENGINECACHE_HOME set), against the interpreter floor `python -c pass`. Goal: under {STARTUP_GOAL_S} s "
        "wall each (the ratio column is against the bare interpreter).",
        notes="Read commands select through the stdlib `sqlite3` where the catalog is a plain SQLite file at the "
        "head revision (enginecache.db.reader), so they import neither SQLAlchemy nor SQLModel nor Alembic; "
        "`--help` imports Typer (and rich for its panels) only. What is left above the floor: Typer, and "
        "Typer's pydantic-based parameter coercion for any command with a non-bool parameter.",
    )
    report.compare_many(
        FLOOR_PASS,
        [
            (Command(f"enginecache {name}", [*cli, *args], env), name, None, f"goal: under {STARTUP_GOAL_S} s")
            for name, args in commands
        ],
        section=SECTION_STARTUP,
        params={"goal_s": STARTUP_GOAL_S},
    )


# -- one-shot build -------------------------------------------------------------------------


def _retire_ready(db: Path) -> None:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("UPDATE engines SET status = 'RETIRED' WHERE status = 'READY'")
        conn.commit()


def _last_build_seconds(db: Path) -> float:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute("SELECT build_seconds FROM engines WHERE status = 'READY' ORDER BY id DESC").fetchone()
    if row is None or row[0] is None:
        raise RuntimeError("the one-shot build recorded no READY engine")
    return float(row[0])


def bench_build(report: Report, scratch: Path) -> None:
    report.section(
        SECTION_BUILD,
        "`enginecache build` of a small model on a cache miss, in a new process with no worker running (the "
        "command runs the job on a one-shot worker of its own), against `python -c pass`. Goal: wall - the "
        f"build's own recorded `build_seconds` at most {BUILD_OVERHEAD_GOAL_S} s (`params.overhead_s`).",
        notes="The one-shot worker forks a copy of the command's own process before any thread starts and runs "
        "each attempt in a child forked from that copy (it preloads the job's backend library meanwhile), so the "
        "attempt starts warm without a fork server's fresh interpreter. The previous engine is retired between "
        "samples (not timed), so each sample is a miss.",
    )
    home = scratch / "build"
    model = small_model(scratch)
    run_cli(home, "model", "add", str(model), "--name", "small")
    db = home / "catalog.db"
    cli = cli_argv()
    env = {"ENGINECACHE_HOME": str(home)}
    for backend, extra in (("ort", []), ("rtx", ["--target", "sm86"])):
        ours = Command(f"enginecache build ({backend})", [*cli, "build", "small", "--backend", backend, *extra], env)
        _retire_ready(db)
        run_once(ours)  # warm-up (page cache, bytecode)
        run_once(FLOOR_PASS)
        samples_a, samples_b, loads = [], [], [os.getloadavg()[0]]
        for _ in range(report.pairs):
            _retire_ready(db)
            sample = run_once(ours)
            samples_a.append(replace(sample, extra={**sample.extra, "build_seconds": _last_build_seconds(db)}))
            samples_b.append(run_once(FLOOR_PASS))
            loads.append(os.getloadavg()[0])
        overhead = [s.wall_s - s.extra["build_seconds"] for s in samples_a]
        params = {
            "backend": backend,
            "build_seconds": [s.extra["build_seconds"] for s in samples_a],
            "overhead_s": {"per_sample": overhead, "min": min(overhead), "median": statistics.median(overhead)},
            "goal_overhead_s": BUILD_OVERHEAD_GOAL_S,
            "goal_met": statistics.median(overhead) <= BUILD_OVERHEAD_GOAL_S,
        }
        figure = _figure(
            ours,
            FLOOR_PASS,
            samples_a,
            samples_b,
            loads,
            section=SECTION_BUILD,
            name=f"one-shot build, {backend}",
            relation="floor",
            params=params,
            goal_ratio=None,
            notes=f"overhead (wall - build_seconds) median {statistics.median(overhead):.3f} s, "
            f"min {min(overhead):.3f} s; goal at most {BUILD_OVERHEAD_GOAL_S} s",
            progress=True,
        )
        log(f"    overhead median {statistics.median(overhead):.3f} s (build_seconds {params['build_seconds']})")
        report.figures.append(figure)


# -- listing at scale -----------------------------------------------------------------------


def _time_text(value: datetime, sqlite: bool) -> Any:
    """A timestamp as the product stores it: naive UTC text on SQLite (UTCDateTime), aware elsewhere."""
    return value.astimezone(UTC).replace(tzinfo=None).isoformat(" ", "microseconds") if sqlite else value


def seed_rows(rows: int, *, sqlite: bool, seed: int = 11) -> Iterator[tuple[str, list[str], Iterable[tuple[Any, ...]]]]:
    """(table, columns, row tuples) for a catalog of 50 models, `rows` engines and `rows` jobs, as the
    product writes them (JSON as text, booleans as 0/1 and naive UTC text on SQLite)."""
    rng = random.Random(seed)
    now = datetime.now(UTC)

    js = json.dumps

    def flag(value: bool) -> Any:
        return int(value) if sqlite else value

    info = {
        "inputs": [{"name": "input", "dtype": "float32", "shape": ["batch", 3, 224, 224], "dynamic": True}],
        "outputs": [{"name": "output", "dtype": "float32", "shape": ["batch", 1000], "dynamic": True}],
        "opsets": {"": 17},
        "ir_version": 8,
        "op_histogram": {"Conv": 52, "Relu": 30, "Add": 10},
    }
    models = [
        (
            i,
            f"model_{i:03d}",
            f"{i:064x}",
            "model.onnx",
            f"models/{i:064x}/model.onnx",
            10_000_000 + i,
            js(info),
            None,
            js({}),
            None,
            _time_text(now - timedelta(days=90, minutes=i), sqlite),
        )
        for i in range(1, 51)
    ]
    yield (
        "models",
        [
            "id",
            "name",
            "digest",
            "filename",
            "store_path",
            "size_bytes",
            "info",
            "parent_id",
            "recipe",
            "recipe_key",
            "created_at",
        ],
        models,
    )

    host = {
        "hostname": "builder-1",
        "os": "Linux",
        "os_release": "6.8",
        "machine": "x86_64",
        "python": "3.11.7",
        "cpu_model": "Intel Xeon",
        "cpu_isa": ["avx2", "avx512f"] * 10,
        "gpus": [],
        "packages": {"onnx": "1.23"},
    }
    log_text = "[phase] Building engine\n" + "layer fusion ... done\n" * 60  # about 1.3 KB, never listed

    def engines() -> Iterator[tuple[Any, ...]]:
        for i in range(1, rows + 1):
            created = now - timedelta(seconds=(rows - i) * 30)
            backend = ("rtx", "ort", "trt")[i % 3]
            targets = ("sm86", "x86_64-avx2", "sm80,sm86")[i % 3]
            digest = f"{rng.getrandbits(256):064x}"
            ingredients = {
                "schema": 1,
                "onnx_digest": f"{i % 50 + 1:064x}",
                "precision": {"precision": "fp32"},
                "build_options": {"opt_level": 3, "workspace_bytes": None},
                "backend": backend,
                "backend_version": "1.7.1.116",
                "target": targets.split(","),
                "os": "Linux",
            }
            yield (
                i,
                i % 50 + 1,
                None,
                backend,
                "1.7.1.116",
                ("fp32", "fp16", "int8")[i % 3],
                targets,
                f"{rng.getrandbits(256):064x}",
                ("READY", "READY", "FAILED", "RETIRED")[i % 4],
                f"{i % 50 + 1:064x}",
                js(ingredients),
                js({"precision": "fp32"}),
                js(ingredients["build_options"]),
                js({"targets": targets.split(",")}),
                "Linux",
                js(host),
                js([{"name": "input", "shape": [1, 3, 224, 224]}]),
                js(["default profile for input"]),
                digest,
                digest[::-1],
                13_000_000 + i,
                f"objects/sha256/{digest[:2]}/{digest}",
                0.1 + (i % 17) / 10,
                log_text,
                None if i % 4 != 2 else "build failed: a reason",
                _time_text(created, sqlite),
                _time_text(created + timedelta(seconds=2), sqlite),
                None,
                i,
                1,
            )

    yield (
        "engines",
        [
            "id",
            "model_id",
            "variant_model_id",
            "backend",
            "backend_version",
            "precision",
            "targets",
            "cache_key",
            "status",
            "onnx_digest",
            "key_ingredients",
            "precision_recipe",
            "build_options",
            "target_info",
            "os",
            "host",
            "io",
            "warnings",
            "sha256",
            "blake3",
            "size_bytes",
            "blob_path",
            "build_seconds",
            "builder_log",
            "error",
            "created_at",
            "finished_at",
            "verified_at",
            "job_id",
            "job_attempt",
        ],
        engines(),
    )

    def jobs() -> Iterator[tuple[Any, ...]]:
        for i in range(1, rows + 1):
            created = now - timedelta(seconds=(rows - i) * 30)
            status = ("SUCCEEDED", "SUCCEEDED", "FAILED", "DEAD")[i % 4]
            yield (
                i,
                "build",
                status,
                None,
                js({"model": str(i % 50 + 1), "backend": "rtx", "targets": ["sm86"]}),
                js({"backend": "rtx", "backend_version": "1.7.1.116", "os": "Linux"}),
                1,
                3,
                3600.0,
                "worker-1",
                None,
                None,
                None,
                flag(False),
                1.0,
                "Building engine",
                "line\n" * 30,
                None if status == "SUCCEEDED" else "an error",
                i if status == "SUCCEEDED" else None,
                _time_text(created, sqlite),
                _time_text(created, sqlite),
                _time_text(created + timedelta(seconds=1), sqlite),
                _time_text(created + timedelta(seconds=3), sqlite),
                _time_text(created + timedelta(seconds=3), sqlite),
            )

    yield (
        "jobs",
        [
            "id",
            "kind",
            "status",
            "idempotency_key",
            "payload",
            "requirements",
            "attempts",
            "max_attempts",
            "timeout_seconds",
            "lease_owner",
            "runner_pid",
            "lease_token",
            "lease_expires_at",
            "cancel_requested",
            "progress",
            "phase",
            "log_tail",
            "error",
            "result_engine_id",
            "run_after",
            "created_at",
            "started_at",
            "finished_at",
            "updated_at",
        ],
        jobs(),
    )


def seed_catalog(db_url: str, home: Path, rows: int) -> None:
    """Migrate an empty catalog through the product, then bulk-insert `rows` engines and jobs."""
    home.mkdir(parents=True, exist_ok=True)
    from enginecache.db.catalog import Catalog

    catalog = Catalog(db_url)  # creates and migrates
    sqlite = catalog.is_sqlite
    catalog.dispose()
    started = time.perf_counter()
    if sqlite:
        with contextlib.closing(sqlite3.connect(db_url.removeprefix("sqlite:///"))) as conn:
            conn.execute("PRAGMA synchronous=OFF")
            for table, columns, data in seed_rows(rows, sqlite=True):
                sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})"
                it = iter(data)
                while batch := [row for _, row in zip(range(BATCH), it, strict=False)]:
                    conn.executemany(sql, batch)
                conn.commit()
            conn.execute("ANALYZE")
            conn.commit()
    else:
        import psycopg

        with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
            for table, columns, data in seed_rows(rows, sqlite=False):
                with conn.cursor() as cursor, cursor.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
                    for row in data:
                        copy.write_row(row)
                conn.commit()
                with conn.cursor() as cursor:  # the serials, as inserts through the product leave them
                    cursor.execute(
                        f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))"
                    )
                conn.commit()
        with psycopg.connect(db_url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")
    log(f"    seeded {rows:,d} engines and jobs in {time.perf_counter() - started:.1f} s")


@contextlib.contextmanager
def pg_database() -> Iterator[str | None]:
    """A PostgreSQL database of our own (dropped afterwards); None where the server is unreachable."""
    import psycopg

    name = f"enginecache_bench_cli_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True)
    except psycopg.Error as err:
        log(f"    PostgreSQL unreachable at {PG_ADMIN_URL}: {err}")
        yield None
        return
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


# Raw SQL + json: the same SELECT with the DBAPI alone, the same dicts, the same bytes (the floor).
FLOOR_LISTING = r"""
import json, os, sys
from datetime import UTC, datetime
what, url, home = sys.argv[1], sys.argv[2], sys.argv[3]
sqlite = url.startswith("sqlite:///")
if sqlite:
    import sqlite3
    conn = sqlite3.connect(url[len("sqlite:///"):])
    cursor = conn.cursor()
else:
    import psycopg
    conn = psycopg.connect(url)
    cursor = conn.cursor(name="floor")
    cursor.itersize = 1000
def t(v):
    if v is None: return None
    if sqlite: v = datetime.fromisoformat(v)
    return (v.replace(tzinfo=UTC) if v.tzinfo is None else v.astimezone(UTC)).isoformat()
def j(v):
    return json.loads(v) if sqlite else v
if what.startswith("engines"):
    cursor.execute("SELECT e.id, e.model_id, e.variant_model_id, e.backend, e.backend_version, e.precision, "
                   "e.targets, e.cache_key, e.sha256, e.blake3, e.size_bytes, e.build_seconds, e.status, e.blob_path, "
                   "e.created_at, e.finished_at, e.warnings, e.error, m.name FROM engines e "
                   "LEFT OUTER JOIN models m ON m.id = e.model_id ORDER BY e.created_at DESC, e.id DESC")
    def row(r):
        return {"id": r[0], "model": r[18], "model_id": r[1], "variant_model_id": r[2], "backend": r[3],
                "backend_version": r[4], "precision": r[5], "targets": r[6].split(",") if r[6] else [],
                "cache_key": r[7], "sha256": r[8], "blake3": r[9], "size_bytes": r[10], "build_seconds": r[11],
                "status": r[12], "path": os.path.join(home, r[13]) if r[13] else None, "created_at": t(r[14]),
                "finished_at": t(r[15]), "warnings": list(j(r[16])), "error": r[17]}
    def line(d):
        return (f"{d['id']:>4}  {d['model'] or '?':<24} {d['backend']:<4} {d['precision']:<5} "
                f"{','.join(d['targets']):<28} {d['status']:<8} {(d['sha256'] or '')[:16]}")
else:
    cursor.execute("SELECT id, kind, status, payload, requirements, attempts, max_attempts, lease_owner, runner_pid, "
                   "cancel_requested, progress, phase, log_tail, error, result_engine_id, created_at, started_at, "
                   "finished_at FROM jobs ORDER BY id DESC LIMIT 1000000000")
    def row(r):
        return {"id": r[0], "kind": r[1], "status": r[2], "attempts": r[5], "max_attempts": r[6],
                "progress": round(r[10], 4), "phase": r[11], "worker": r[7], "runner_pid": r[8],
                "requirements": j(r[4]), "error": r[13], "log_tail": r[12], "created_at": t(r[15]),
                "started_at": t(r[16]), "finished_at": t(r[17]), "result_engine_id": r[14],
                "cancel_requested": bool(r[9]), "payload": j(r[3]), "waiting": None}
    line = None
encode = json.JSONEncoder(default=str).encode
out = sys.stdout
batch = []
count = 0
as_json = what.endswith("json")
for r in cursor:
    d = row(r)
    batch.append((("[\n" if count == 0 else ",\n") + encode(d)) if as_json else line(d) + "\n")
    count += 1
    if len(batch) >= 500:
        out.write("".join(batch)); batch.clear()
batch.append(("\n]\n" if count else "[]\n") if as_json else ("" if count else "no engines\n"))
out.write("".join(batch))
"""


def _listing_commands(db_url: str, home: Path, label: str) -> list[tuple[Command, Command, str]]:
    cli = cli_argv()
    env = {"ENGINECACHE_HOME": str(home), "ENGINECACHE_DB_URL": db_url}
    raw_url = db_url.replace("postgresql+psycopg://", "postgresql://")
    floor = [sys.executable, "-c", FLOOR_LISTING]
    return [
        (
            Command(f"engine list --json ({label})", [*cli, "engine", "list", "--json"], env),
            Command(f"raw SQL + json, engines ({label})", [*floor, "engines-json", raw_url, str(home)]),
            "engine list --json",
        ),
        (
            Command(f"engine list ({label})", [*cli, "engine", "list"], env),
            Command(f"raw SQL + text, engines ({label})", [*floor, "engines-text", raw_url, str(home)]),
            "engine list (text)",
        ),
        (
            Command(f"jobs --json ({label})", [*cli, "jobs", "--limit", "1000000000", "--json"], env),
            Command(f"raw SQL + json, jobs ({label})", [*floor, "jobs-json", raw_url, str(home)]),
            "jobs --json",
        ),
    ]


def _same_output(ours: Command, floor: Command) -> None:
    """The floor must do the same work: byte-identical output (checked once, not timed)."""
    outputs = []
    for command in (ours, floor):
        env = {**os.environ, **(command.env or {})}
        done = subprocess.run(list(command.argv), capture_output=True, env=env, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{command.name}: exit {done.returncode}: {done.stderr[-2000:]!r}")
        outputs.append(done.stdout)
    if outputs[0] != outputs[1]:
        raise RuntimeError(f"{ours.name} and {floor.name} differ: the floor must write the same bytes")


def bench_listing(report: Report, scratch: Path, databases: Sequence[str]) -> None:
    rows = QUICK_ROWS if report.quick else FULL_ROWS
    report.section(
        SECTION_LISTING,
        f"`engine list --json`, `engine list` and `jobs --json` over {rows:,d} engines and {rows:,d} jobs in a new "
        "process, against raw SQL + json (the same SELECT with the DBAPI alone, the same dicts, the same bytes). "
        f"Goals: at most {LISTING_GOAL_RATIO:g}x the floor, peak RSS under {LISTING_RSS_GOAL_BYTES // 2**20} MB.",
        notes="Rows stream from the database (a server-side cursor on PostgreSQL, `fetchmany` on SQLite) and are "
        "written as they come, 500 rows a write; only the listed columns are selected. `--limit/--offset` page.",
    )
    for kind in databases:
        with contextlib.ExitStack() as stack:
            home = scratch / f"listing-{kind}"
            if kind == "sqlite":
                db_url: str | None = f"sqlite:///{home / 'catalog.db'}"
            else:
                db_url = stack.enter_context(pg_database())
                if db_url is None:
                    report.sections[SECTION_LISTING]["notes"] += " PostgreSQL was unreachable: no figures for it."
                    continue
            assert db_url is not None
            seed_catalog(db_url, home, rows)
            for ours, floor, name in _listing_commands(db_url, home, kind):
                _same_output(ours, floor)
                report.compare(
                    ours,
                    floor,
                    section=SECTION_LISTING,
                    name=f"{name}, {kind}",
                    params={"rows": rows, "database": kind, "rss_goal_bytes": LISTING_RSS_GOAL_BYTES},
                    goal_ratio=LISTING_GOAL_RATIO,
                )


# -- entry points ---------------------------------------------------------------------------


def run(report: Report) -> None:
    parts = report.options.get("cli_parts") or PARTS
    databases = report.options.get("cli_db") or DATABASES
    scratch = Path(tempfile.mkdtemp(prefix="bench-cli-", dir=report.scratch))
    try:
        if "startup" in parts:
            bench_startup(report, scratch)
        if "build" in parts:
            bench_build(report, scratch)
        if "listing" in parts:
            bench_listing(report, scratch, databases)
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--only", default=",".join(PARTS), help="comma-separated: " + ",".join(PARTS))
    parser.add_argument("--db", default=",".join(DATABASES), help="comma-separated: " + ",".join(DATABASES))
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "cli.json")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as scratch:
        report = Report(
            quick=args.quick,
            pairs=args.pairs,
            scratch=Path(scratch),
            options={"cli_parts": args.only.split(","), "cli_db": args.db.split(",")},
        )
        run(report)
        results: dict[str, Any] = {
            "machine": machine_info(Path(scratch)),
            "sections": report.sections,
            "figures": [f.to_dict() for f in report.figures],
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
