"""Timings' charts tell the truth (issue 28, points 4 and 14): the load-phase chart stacks what its
caption says it stacks (first inference starts where the phases before it end, the bar's top is
their sum), its legend lists only the phases present, and the build-time chart draws no whiskers
for a group of one engine."""

from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np
from streamlit.testing.v1 import AppTest

from enginecache.db.models import LoadRunRecord
from tests.dashboardkit import Seeded, view

ORT_PHASES = {"read_verify_s": 0.05, "deserialize_s": 0.12, "first_inference_s": 0.39}  # no validity, context, IO


def _chart(at: AppTest, key: str) -> dict[str, Any]:
    for chart in at.get("plotly_chart"):
        if key in chart.proto.id:
            return dict(json.loads(chart.proto.spec))
    raise AssertionError(f"no chart {key}")


def _numbers(values: Any) -> list[float]:
    """A plotly trace's numbers (a numpy array is serialised as a typed buffer, a list as a list)."""
    if isinstance(values, dict):
        return [float(v) for v in np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"])]
    return [float(v) for v in values]


def test_the_load_phase_chart_stacks_what_it_says_and_lists_only_present_phases(seeded: Seeded) -> None:
    with seeded.app.catalog.write() as session:
        session.add(
            LoadRunRecord(
                engine_id=seeded.engine_id,
                model_id=seeded.model_id,
                backend="ort",
                precision="fp32",
                targets="cpu",
                hostname="h",
                host_target="cpu",
                verdict="PASS",
                load_s=0.17,
                read_verify_s=ORT_PHASES["read_verify_s"],
                deserialize_s=ORT_PHASES["deserialize_s"],
                first_inference_s=ORT_PHASES["first_inference_s"],
            )
        )
    at = view("timings").run()
    assert not at.exception, at.exception
    spec = _chart(at, "timings_load_chart")
    traces = spec["data"]
    assert [t["name"] for t in traces] == ["read + verify", "deserialize", "first inference"], "no absent phase"
    tops = [_numbers(t["base"])[0] + _numbers(t["y"])[0] for t in traces]
    bases = [_numbers(t["base"])[0] for t in traces]
    assert bases == [0.0, tops[0], tops[1]], "each phase starts where the one before it ends"
    assert abs(tops[-1] - sum(ORT_PHASES.values())) < 1e-9, "the bar's top is the sum of the phases (0.56 s)"
    assert spec["layout"]["barmode"] == "overlay", "the stacking is the explicit bases, not plotly's"
    assert any("stacked in the order they run" in c.value for c in at.caption)


def test_a_build_of_one_engine_has_no_whiskers_and_labels_carry_units(seeded: Seeded) -> None:
    at = view("timings").run()
    assert not at.exception, at.exception
    spec = _chart(at, "timings_build_chart")
    [trace] = spec["data"]
    error = trace["error_y"]
    assert all(v != v for v in _numbers(error["array"]) + _numbers(error["arrayminus"])), "one sample: no whisker"
    assert "one engine" in trace["hovertext"][0]
    assert spec["layout"]["yaxis"]["title"]["text"] == "mean build time (s)"
