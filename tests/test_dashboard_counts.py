"""Counts agree between pages (issue 28, point 11): Models' heading counts source models as
Overview's "Models" does, the converted variants apart, and a variant's row shows no `None`."""

from __future__ import annotations

from tests.dashboardkit import Seeded, frame, view
from tests.test_dashboard_finding import _variant


def test_models_heading_and_overview_count_the_same_models(seeded: Seeded) -> None:
    _variant(seeded)
    overview = view("overview").run()
    assert not overview.exception, overview.exception
    metrics = {m.label: m.value for m in overview.metric}
    assert metrics["Models"] == "1"
    at = view("models").run()
    assert not at.exception, at.exception
    assert "Models (1, and 1 converted variant(s))" in [s.value for s in at.subheader]
    table = frame(at, "name", "version", "with variants")
    cells = [str(v) for v in table.loc[1].tolist()]
    assert "None" not in cells and "nan" not in cells and "<NA>" not in cells, cells
    assert (table.loc[1, "version"], table.loc[1, "with variants"]) == ("-", "-")
