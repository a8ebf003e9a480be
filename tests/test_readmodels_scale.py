"""The read models written for a catalog at scale (per-day counts over index ranges, build-time
groups in index order, the busiest serving pairs) answer what a plain count over every row answers,
on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus, LoadEventRecord, ModelRecord, utcnow
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.readmodels.days import day_bounds
from enginecache.service.readmodels.overview import cache_activity
from enginecache.service.readmodels.timings import build_time_groups, serving_hit_rates
from tests.modelfactory import make_mlp

STATUSES = [EngineStatus.READY] * 6 + [EngineStatus.FAILED, EngineStatus.RETIRED, EngineStatus.CORRUPT]


def _engine(model_id: int, i: int, rng: random.Random, when: datetime) -> EngineRecord:
    status = rng.choice(STATUSES)
    return EngineRecord(
        model_id=model_id,
        backend=rng.choice(["rtx", "ort"]),
        backend_version="1",
        precision=rng.choice(["fp32", "fp16"]),
        targets=rng.choice(["sm86", "sm89", "sm80,sm86"]),
        cache_key=f"{i:064x}",
        status=status,
        onnx_digest="d",
        os="Linux",
        build_seconds=rng.uniform(1, 9) if status != EngineStatus.FAILED else None,
        size_bytes=rng.choice([None, rng.randint(1, 99) * 2**20]),
        created_at=when,
        job_id=i if rng.random() < 0.8 else None,
    )


@pytest.fixture
def catalog(catalog_ctx: AppContext, tmp_path: Path) -> AppContext:
    """Two models (one twice under one name: its new version), engines, jobs and load events over 40 days."""
    app = catalog_ctx
    rng = random.Random(5)
    ids = [
        register_model(app, make_mlp(tmp_path / f"m{n}.onnx", seed=n), name=name, new_version=n == 2).model.id or 0
        for n, name in enumerate(["alpha", "beta", "alpha"])
    ]
    now = utcnow()
    with app.catalog.write() as session:
        for i in range(1, 160):
            session.add(_engine(rng.choice(ids), i, rng, now - timedelta(hours=rng.randint(0, 40 * 24))))
    with app.catalog.write() as session:
        for i in range(1, 160):
            finished = now - timedelta(hours=rng.randint(0, 40 * 24))
            status = rng.choice([JobStatus.SUCCEEDED] * 3 + [JobStatus.FAILED])
            result = rng.randint(1, 159) if status == JobStatus.SUCCEEDED and rng.random() < 0.9 else None
            kind = rng.choice(["build", "build", "test_load"])
            session.add(JobRecord(id=i, kind=kind, status=status, result_engine_id=result, finished_at=finished))
        for _ in range(600):
            session.add(
                LoadEventRecord(
                    hostname=rng.choice(["h1", "h2", "h3"]),
                    model_name=rng.choice(["alpha", "beta", "gamma"]),
                    backend="rtx",
                    precision="fp16",
                    host_target="sm86",
                    outcome=rng.choice(["hit", "hit", "hit", "miss", "built", "rejected"]),
                    source=rng.choice(["load_or_build"] * 4 + ["build_request"]),
                    total_s=rng.uniform(0.01, 2.0),
                    created_at=now - timedelta(minutes=rng.randint(0, 40 * 24 * 60)),
                )
            )
    return app


def _rows(app: AppContext, table: Any) -> list[Any]:
    with app.catalog.read() as session:
        return list(session.exec(select(table)).all())


def test_cache_activity_counts_every_day_as_a_scan_would(catalog: AppContext) -> None:
    app = catalog
    since = utcnow() - timedelta(days=30)
    engines = {e.id: e for e in _rows(app, EngineRecord)}
    expected: dict[str, Counter[str]] = defaultdict(Counter)
    built = (EngineStatus.READY, EngineStatus.CORRUPT, EngineStatus.RETIRED)
    for e in engines.values():
        if e.created_at >= since and e.status in built:
            expected[e.created_at.date().isoformat()]["misses"] += 1
    for j in _rows(app, JobRecord):
        if j.kind == "build" and j.status == JobStatus.SUCCEEDED and j.finished_at and j.finished_at >= since:
            engine = engines.get(j.result_engine_id)
            if engine is not None and engine.job_id != j.id:
                expected[j.finished_at.date().isoformat()]["hits"] += 1
    for ev in _rows(app, LoadEventRecord):
        if ev.created_at < since:
            continue
        day = expected[ev.created_at.date().isoformat()]
        if ev.source == "build_request" and ev.outcome == "hit":
            day["hits"] += 1
        elif ev.source == "load_or_build":
            day["serving_hits" if ev.outcome == "hit" else "serving_misses"] += 1
    got = {d.day: Counter({k: v for k, v in vars(d).items() if k != "day" and v}) for d in cache_activity(app)}
    # the first day of the window is partial: its start moved a little while the test ran
    first = min(expected)
    assert {k: v for k, v in got.items() if k != first} == {k: v for k, v in expected.items() if k != first and v}
    assert sum(v["hits"] for v in got.values()) > 0 and sum(v["serving_misses"] for v in got.values()) > 0


def test_day_bounds_cover_the_window_in_utc_days() -> None:
    now = datetime(2026, 12, 1, 7, 30, tzinfo=UTC)
    bounds = day_bounds(30, now=now)
    assert len(bounds) == 31 and bounds[0][1] == now - timedelta(days=30) and bounds[-1][2] > now
    assert all(stop == start for (_, _, stop), (_, start, _) in itertools.pairwise(bounds))


def test_build_time_groups_aggregate_per_model_name(catalog: AppContext) -> None:
    app = catalog
    names = {m.id: m.name for m in _rows(app, ModelRecord)}
    groups: dict[tuple[str, str, str, str], list[EngineRecord]] = defaultdict(list)
    for e in _rows(app, EngineRecord):
        if e.build_seconds is not None and e.status in (EngineStatus.READY, EngineStatus.RETIRED):
            groups[(names[e.model_id], e.backend, e.targets, e.precision)].append(e)
    got = {(g.model, g.backend, g.targets, g.precision): g for g in build_time_groups(app)}
    assert set(got) == set(groups)
    for key, engines in groups.items():
        g = got[key]
        seconds = [e.build_seconds or 0.0 for e in engines]
        sizes = [e.size_bytes for e in engines if e.size_bytes is not None]
        assert g.engines == len(engines)
        assert g.mean_seconds == pytest.approx(sum(seconds) / len(seconds))
        assert (g.min_seconds, g.max_seconds) == pytest.approx((min(seconds), max(seconds)))
        assert g.mean_size_bytes == pytest.approx(sum(sizes) / len(sizes) if sizes else 0.0)
    order = [(g.model, g.precision, g.targets) for g in build_time_groups(app)]
    assert order == sorted(order)


def test_serving_hit_rates_are_the_busiest_pairs_days(catalog: AppContext) -> None:
    app = catalog
    since = utcnow() - timedelta(days=30)
    events = [e for e in _rows(app, LoadEventRecord) if e.source == "load_or_build" and e.created_at >= since]
    calls = Counter((e.model_name, e.hostname) for e in events)
    rates = serving_hit_rates(app, days=30, pairs=4)
    assert (rates.pairs_shown, rates.pairs_total) == (4, len(calls))
    busiest = sorted(calls, key=lambda p: (-calls[p], p))[:4]
    per_day: dict[tuple[str, str, str], list[LoadEventRecord]] = defaultdict(list)
    for e in events:
        if (e.model_name, e.hostname) in busiest:
            per_day[(e.model_name, e.hostname, e.created_at.date().isoformat())].append(e)
    got = {(r["model"], r["host"], r["day"]): r for r in rates.rows}
    assert set(got) == set(per_day)
    for key, day in per_day.items():
        hits = sum(e.outcome == "hit" for e in day)
        assert (got[key]["calls"], got[key]["hits"]) == (len(day), hits)
        assert got[key]["hit_rate"] == pytest.approx(hits / len(day))
