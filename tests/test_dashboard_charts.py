"""Timings' charts (issue 12): cold start (the recorded build) against warm start (the recorded
`load_or_build` cache hits of the same engine), labelled, on a log axis with decimal labels; every
chart says in one line what it shows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.db.models import EngineRecord, LoadEventRecord
from enginecache.service.readmodels.timings import cold_warm_starts
from tests.dashboardkit import Seeded, view


def _event(seeded: Seeded, outcome: str, source: str, total: float) -> LoadEventRecord:
    return LoadEventRecord(
        hostname="gpu-box-1",
        model_name="convnet",
        model_id=seeded.model_id,
        engine_id=seeded.engine_id,
        backend="rtx",
        precision="fp32",
        host_target="sm86",
        outcome=outcome,
        source=source,
        total_s=total,
    )


def _hits(seeded: Seeded, *seconds: float) -> None:
    with seeded.app.catalog.write() as session:
        for total in seconds:
            session.add(_event(seeded, "hit", "load_or_build", total))
        # a miss and a build request are no warm start
        for source, outcome in (("load_or_build", "miss"), ("build_request", "hit")):
            session.add(_event(seeded, outcome, source, 99.0))


def _chart(at: AppTest, key: str) -> dict[str, Any]:
    for chart in at.get("plotly_chart"):
        spec = json.loads(chart.proto.spec)
        if key in chart.proto.id:
            return dict(spec)
    raise AssertionError(f"no chart {key}")


@pytest.mark.slow
def test_cold_start_against_the_products_own_cache_hits_of_the_same_engine(seeded: Seeded) -> None:
    _hits(seeded, 0.010, 0.030)
    with seeded.app.catalog.read() as session:
        engine = session.get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.build_seconds is not None
    [row] = cold_warm_starts(seeded.app)
    assert (row.model, row.engines, row.hits) == ("convnet", 1, 2)
    assert abs(row.hit_s - 0.020) < 1e-9 and abs(row.build_s - engine.build_seconds) < 1e-9

    at = view("timings").run()
    assert not at.exception
    assert "Cold start (build) against warm start (load)" in [s.value for s in at.subheader]
    spec = _chart(at, "timings_cold_warm_chart")
    cold, warm = spec["data"]
    assert cold["name"] == "cold start: build" and warm["name"] == "warm start: load_or_build cache hit"
    axis = spec["layout"]["yaxis"]
    assert axis["type"] == "log" and axis["dtick"] == 1 and axis["tickformat"] == "~g", "decades, in decimals"
    captions = [c.value for c in at.caption]
    assert any(c.startswith("Per model x target x precision: the mean seconds building") for c in captions)
    assert any(c.startswith("Mean seconds a build took") for c in captions)


def test_without_cache_hits_the_comparison_says_what_it_waits_for(seeded: Seeded) -> None:
    at = view("timings").run()
    assert not at.exception
    assert any("No load_or_build cache hit" in i.value for i in at.info)
