"""Timings: plotly charts from SQL aggregates (one row per model x backend x targets x
precision, never one per engine): build time, engine size against build time, load-phase
timings once test-loads exist, cold start (build) against warm start (load) per model, and the
`load_or_build` hit rate of the busiest model and host pairs.

The charts are plotly graph objects, one trace per colour, built from the aggregate rows: plotly
express builds the same figures through a data frame per trace and a figure update per property,
which cost seconds here for a catalog's 500 groups (and importing it costs a few hundred ms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from enginecache.dashboard import data
from enginecache.service.readmodels.timings import BuildTimeGroup, ColdWarm, HitRates

HIT_RATE_DAYS = 30
COLD_WARM_DAYS = 30
# A log axis labelled at each power of ten, in decimals (0.01, 0.1, 1, 10), not plotly's default
# of every digit between them ("2 3 ... 9 1").
LOG_AXIS = {"type": "log", "dtick": 1, "tickformat": "~g", "minor": {"showgrid": True}}
HIT_RATE_PAIRS = 10
SIZE_MAX = 28  # the largest marker's diameter (px), as plotly express's size_max


def render() -> None:
    key, groups = data.start_view(
        "Timings", data.build_time_groups, "No engines built yet: timings appear once a build is READY."
    )
    if not groups:
        return
    st.subheader("Build time by model, target and precision")
    st.plotly_chart(_build_time_chart(groups), key="timings_build_chart")
    st.caption(
        "Mean seconds a build took per model x target x precision; where it averages several engines, the "
        "whiskers span the fastest to the slowest."
    )

    st.subheader("Engine size against build time")
    st.plotly_chart(_size_chart(groups), key="timings_size_chart")
    st.caption("Each point is one model x target x precision; its size is how many engines it averages.")

    _cold_warm_chart(data.cold_warm_starts(key, COLD_WARM_DAYS))
    _load_charts(data.load_phase_stats(key))
    _hit_rate_chart(data.serving_hit_rates(key, HIT_RATE_DAYS, HIT_RATE_PAIRS))

    with st.expander("Aggregates"):
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "model": g.model,
                        "backend": g.backend,
                        "target": _target(g),
                        "precision": g.precision,
                        "engines": g.engines,
                        "mean build s": round(g.mean_seconds, 2),
                        "min build s": round(g.min_seconds, 2),
                        "max build s": round(g.max_seconds, 2),
                        "mean size MiB": round(g.mean_size_bytes / 2**20, 2),
                    }
                    for g in groups
                ]
            ),
            hide_index=True,
            key="timings_table",
            column_config={
                c: st.column_config.NumberColumn(format="%.2f")
                for c in ("mean build s", "min build s", "max build s", "mean size MiB")
            },
        )


def _target(g: BuildTimeGroup) -> str:
    return f"{g.backend} {g.targets}"


def _by(rows: Sequence[Any], key: Any) -> dict[Any, list[Any]]:
    """Rows per colour, in order of first appearance (as plotly express orders its traces)."""
    out: dict[Any, list[Any]] = {}
    for row in rows:
        out.setdefault(key(row), []).append(row)
    return out


def _numbers(values: Sequence[float | None]) -> np.ndarray[Any, Any]:
    """A float array (None as NaN): plotly validates an array in one pass, a list item by item."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _figure(traces: list[dict[str, Any]], layout: dict[str, Any]) -> go.Figure:
    """A figure from trace dicts, validated once (trace objects would be validated, then copied)."""
    return go.Figure({"data": traces, "layout": {"margin": {"t": 30}, **layout}})


def _build_time_chart(groups: list[BuildTimeGroup]) -> go.Figure:
    """Mean build time per model and target (a two-level category axis), one bar per precision,
    min to max as error bars."""
    traces = []
    for precision, rows in _by(groups, lambda g: g.precision).items():
        mean = _numbers([g.mean_seconds for g in rows])
        traces.append(
            {
                "type": "bar",
                "name": precision,
                "x": [[g.model for g in rows], [_target(g) for g in rows]],
                "y": mean,
                "error_y": {
                    "type": "data",
                    "symmetric": False,
                    "array": _spread([g.max_seconds - g.mean_seconds for g in rows], rows),
                    "arrayminus": _spread([g.mean_seconds - g.min_seconds for g in rows], rows),
                },
                "hovertext": [_build_hover(g) for g in rows],
                "hoverinfo": "text",
            }
        )
    layout = {"barmode": "group", "height": 380, "legend": {"title": {"text": "precision"}}}
    return _figure(traces, {**layout, "yaxis": {"title": {"text": "mean build time (s)"}}})


def _spread(values: list[float], rows: list[BuildTimeGroup]) -> np.ndarray[Any, Any]:
    """Whisker lengths, NaN (no whisker) for a group of one engine: one sample has no spread."""
    return _numbers([v if g.engines > 1 else None for v, g in zip(values, rows, strict=True)])


def _build_hover(g: BuildTimeGroup) -> str:
    head = f"{g.model} {_target(g)} {g.precision}: "
    if g.engines == 1:
        return head + f"{g.mean_seconds:.2f} s, one engine"
    return (
        head
        + f"mean {g.mean_seconds:.2f} s (min {g.min_seconds:.2f}, max {g.max_seconds:.2f}) over {g.engines} engines"
    )


def _size_chart(groups: list[BuildTimeGroup]) -> go.Figure:
    """Mean engine size against mean build time, a point per group sized by its engines (area, like
    plotly express's `size`), coloured by precision with a symbol per backend."""
    largest = max(g.engines for g in groups)
    symbols = ("circle", "diamond", "square", "x", "cross", "triangle-up")
    backends = {b: symbols[i % len(symbols)] for i, b in enumerate(dict.fromkeys(g.backend for g in groups))}
    traces = []
    for (precision, backend), rows in _by(groups, lambda g: (g.precision, g.backend)).items():
        traces.append(
            {
                "type": "scatter",
                "name": f"{precision}, {backend}",
                "mode": "markers",
                "x": _numbers([g.mean_seconds for g in rows]),
                "y": _numbers([g.mean_size_bytes / 2**20 for g in rows]),
                "marker": {
                    "size": _numbers([g.engines for g in rows]),
                    "sizemode": "area",
                    "sizeref": 2.0 * largest / SIZE_MAX**2,
                    "symbol": backends[backend],
                },
                "hovertext": [f"{g.model} {_target(g)} {precision}: {g.engines} engine(s)" for g in rows],
            }
        )
    axes = {"xaxis": {"title": {"text": "mean build time (s)"}}, "yaxis": {"title": {"text": "mean size (MiB)"}}}
    # the legend's markers all one size: sized like the points, a group of one engine is a dot
    return _figure(traces, {"height": 380, "legend": {"itemsizing": "constant"}, **axes})


LOAD_PHASES = {
    "read_verify_s": "read + verify",
    "validity_s": "header check",
    "deserialize_s": "deserialize",
    "create_context_s": "create context",
    "allocate_io_s": "allocate IO",
    "first_inference_s": "first inference",
}


def _hit_rate_chart(rates: HitRates) -> None:
    """Serving processes' cache hit rate (`load_or_build`) by day, for the busiest model and host pairs."""
    if not rates.rows:
        st.info("Cache hit rates appear here once serving processes call load_or_build.")
        return
    st.subheader("Cache hit rate of load_or_build, per model and host")
    traces = [
        {
            "type": "scatter",
            "name": name,
            "mode": "lines+markers",
            "x": [r["day"] for r in rows],
            "y": _numbers([r["hit_rate"] for r in rows]),
            "hovertext": [f"{name} {r['day']}: {r['hits']} of {r['calls']} calls" for r in rows],
        }
        for name, rows in _by(rates.rows, lambda r: f"{r['model']} @ {r['host']}").items()
    ]
    layout = {"height": 320, "yaxis": {"range": [0, 1.05], "title": {"text": "hit rate"}}}
    figure = _figure(traces, {**layout, "legend": {"title": {"text": "model @ host"}}})
    st.plotly_chart(figure, key="timings_hit_rate_chart")
    st.caption("The share of load_or_build calls per day that found a READY engine, per model and host.")
    shown = (
        f"all {rates.pairs_total} model and host pairs"
        if rates.pairs_shown == rates.pairs_total
        else f"the {rates.pairs_shown} of {rates.pairs_total:,} model and host pairs with the most calls"
    )
    st.caption(f"Last {rates.days} days, {shown}.")


def _engine_label(row: dict[str, Any]) -> str:
    return f"{row['model']} {row['backend']} {row['precision']} {row['targets']}"


def _load_charts(rows: list[dict[str, Any]] | None) -> None:
    """Load phases, from the test-load harness's aggregates."""
    if not rows:
        st.info("Load-phase timings appear here once engines have been test-loaded (Engines, Test-load).")
        return
    st.subheader("Load-phase timings (test-loads)")
    st.plotly_chart(_load_phase_chart(rows), key="timings_load_chart")
    st.caption(
        "Mean seconds of each phase of a test-load, stacked in the order they run (each bar's top is their sum), "
        "per model x backend x target x precision; only the phases a backend has are drawn."
    )


def _load_phase_chart(rows: list[dict[str, Any]]) -> go.Figure:
    """One bar segment per phase a row recorded, each starting where the phases before it end (an
    explicit `base`: a phase a backend lacks is left out of the stack, never drawn from zero over
    it); a phase no row has is no trace and so not in the legend."""
    labels = [_engine_label(r) for r in rows]
    base = np.zeros(len(rows))
    traces = []
    for phase, name in LOAD_PHASES.items():
        values = _numbers([r.get(phase) for r in rows])
        if np.isnan(values).all():
            continue
        traces.append(
            {
                "type": "bar",
                "name": name,
                "x": labels,
                "y": values,
                "base": base.copy(),
                "hovertext": [
                    f"{label}: {name} {v * 1e3:.1f} ms (mean of {r.get('runs')} run(s))"
                    for label, v, r in zip(labels, values, rows, strict=True)
                ],
                "hoverinfo": "text",
            }
        )
        base = base + np.nan_to_num(values)
    layout = {"barmode": "overlay", "height": 380, "yaxis": {"title": {"text": "mean seconds per test-load"}}}
    return _figure(traces, layout)


def _cold_warm_chart(rows: list[ColdWarm]) -> None:
    """Cold start (the recorded build) against warm start (the recorded cache hits of the same
    engines), per engine group, on a log axis with decimal labels."""
    st.subheader("Cold start (build) against warm start (load)")
    if not rows:
        st.info(
            f"No load_or_build cache hit in the last {COLD_WARM_DAYS} days: the comparison appears once a serving "
            "process has loaded a cached engine."
        )
        return
    labels = [f"{r.model} {r.backend} {r.precision} {r.targets}" for r in rows]
    starts = (
        ("cold start: build", [r.build_s for r in rows], [f"mean of {r.engines} engine build(s)" for r in rows]),
        ("warm start: load_or_build cache hit", [r.hit_s for r in rows], [f"mean of {r.hits} hit(s)" for r in rows]),
    )
    figure = _figure(
        [
            {
                "type": "bar",
                "name": name,
                "x": labels,
                "y": _numbers(values),
                "hovertext": [f"{label}: {v:.4g} s, {how}" for label, v, how in zip(labels, values, hows, strict=True)],
                "hoverinfo": "text",
            }
            for name, values, hows in starts
        ],
        {"barmode": "group", "height": 380, "yaxis": {**LOG_AXIS, "title": {"text": "seconds (log scale)"}}},
    )
    st.plotly_chart(figure, key="timings_cold_warm_chart")
    st.caption(
        "Per model x target x precision: the mean seconds building its engines took (cold start) against the mean "
        f"seconds load_or_build took to hand the same engines out on a cache hit (warm start), last {COLD_WARM_DAYS} "
        "days; both as recorded."
    )
