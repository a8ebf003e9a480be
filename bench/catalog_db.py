"""bench_catalog's catalog: its scale, a temp SQLite file or a dedicated PostgreSQL database, bulk inserts.

`bench_catalog` (a migrated, empty catalog on "sqlite" or "postgresql", removed afterwards) and
`BulkWriter` (`executemany` on SQLite, `COPY` on PostgreSQL); bench/catalog_seed.py seeds through
them, bench/bench_catalog.py and bench/bench_dashboard.py time what was seeded.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sys
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import sqlalchemy as sa  # noqa: E402

from enginecache.db.catalog import sqlite_url  # noqa: E402
from enginecache.service.context import AppContext  # noqa: E402

DATABASES = ("sqlite", "postgresql")
PG_ADMIN_URL = os.environ.get("ENGINECACHE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
PG_BENCH_DB = "enginecache_bench"
BATCH = 20_000
HOT_MODEL = "hot_model"
PRECISIONS = ("fp32", "fp16", "bf16", "int8", "fp8")


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
QUICK = replace(  # a smaller catalog; the same hot engines, lookups and misses timed
    FULL, name="quick", models=20, engines=10_000, jobs=10_000, events=100_000, load_runs=1_000
)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def write_results(out: Mapping[str, Any], path: Path) -> int:
    """Write a run's results to `path` (JSON), log each goal's verdict; 0 when every goal is met."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    for goal, met in out["goals_met"].items():
        log(f"{'met' if met else 'NOT MET'}: {goal}")
    log(f"wrote {path}")
    return 0 if all(out["goals_met"].values()) else 1


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
