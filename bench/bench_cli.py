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
import sqlite3
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for _path in (ROOT, BENCH):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from cli_listing import FLOOR_LISTING, log, pg_database, seed_catalog  # noqa: E402
from harness import Command, Report, _figure, run_once  # noqa: E402
from hostinfo import machine_info  # noqa: E402

SECTION_STARTUP = "CLI start-up and read commands"
SECTION_BUILD = "CLI one-shot build"
SECTION_LISTING = "CLI listing at scale"
STARTUP_GOAL_S = 0.3
BUILD_OVERHEAD_GOAL_S = 1.0
LISTING_GOAL_RATIO = 2.0
LISTING_RSS_GOAL_BYTES = 300 * 2**20
FULL_ROWS = 100_000
QUICK_ROWS = 10_000
SHARED_MODEL = ROOT.parent / "shared" / "models" / "mobilenet_v3_small.onnx"
PARTS = ("startup", "build", "listing")
DATABASES = ("sqlite", "postgresql")


def cli_argv() -> list[str]:
    """The `enginecache` console script beside this interpreter (as a user runs it), else `-m`."""
    script = Path(sys.executable).parent / "enginecache"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "enginecache.cli"]


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
        "samples (not timed), so each sample is a miss. The console script leaves what the command made out of "
        "the interpreter's last garbage collection (enginecache/cli/exiting.py): 150-200 ms of the exit of a "
        "command that imported the ORM and onnx, measured interleaved on this machine.",
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
        notes = (
            f"overhead (wall - build_seconds) median {statistics.median(overhead):.3f} s, "
            f"min {min(overhead):.3f} s; goal at most {BUILD_OVERHEAD_GOAL_S} s"
        )
        figure = _figure(
            (ours, f"one-shot build, {backend}", None, notes),
            FLOOR_PASS,
            samples_a,
            samples_b,
            loads,
            section=SECTION_BUILD,
            relation="floor",
            params=params,
            progress=True,
        )
        log(f"    overhead median {statistics.median(overhead):.3f} s (build_seconds {params['build_seconds']})")
        report.figures.append(figure)


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
