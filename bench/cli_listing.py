"""bench_cli's listing catalogs: `seed_catalog` (a migrated catalog bulk-inserted with `rows` engines
and jobs, straight to the driver), `pg_database` (a PostgreSQL database of its own) and
`FLOOR_LISTING`, the raw SQL + json floor the listing commands are timed against.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent
for _path in (ROOT, BENCH):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


PG_ADMIN_URL = os.environ.get("ENGINECACHE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/test")
BATCH = 10_000


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


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
