"""Timings: plotly charts from SQL aggregates (one row per model x backend x targets x
precision, never one per engine): build time, engine size against build time, load-phase
timings once test-loads exist, and cold start (build) against warm start (load) per model."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from enginecache.dashboard import data


def render() -> None:
    st.title("Timings")
    key = data.catalog_key()
    groups = data.build_time_groups(key)
    if not groups:
        st.info("No engines built yet: timings appear once a build is READY.")
        return
    frame = pd.DataFrame(
        [
            {
                "model": g.model,
                "backend": g.backend,
                "target": f"{g.backend} {g.targets}",
                "precision": g.precision,
                "engines": g.engines,
                "mean build s": g.mean_seconds,
                "min build s": g.min_seconds,
                "max build s": g.max_seconds,
                "mean size MiB": g.mean_size_bytes / 2**20,
            }
            for g in groups
        ]
    )
    st.subheader("Build time by model, target and precision")
    fig = px.bar(
        frame,
        x="model",
        y="mean build s",
        color="precision",
        facet_col="target" if frame["target"].nunique() <= 6 else None,
        barmode="group",
        error_y=frame["max build s"] - frame["mean build s"],
        error_y_minus=frame["mean build s"] - frame["min build s"],
        hover_data=["engines", "min build s", "max build s"],
        height=380,
    )
    st.plotly_chart(fig, key="timings_build_chart")

    st.subheader("Engine size against build time")
    fig = px.scatter(
        frame,
        x="mean build s",
        y="mean size MiB",
        color="precision",
        symbol="backend",
        size="engines",
        size_max=28,
        hover_data=["model", "target"],
        height=380,
    )
    st.plotly_chart(fig, key="timings_size_chart")
    st.caption("Each point is one model x target x precision; its size is how many engines it averages.")

    _load_charts(data.load_phase_stats(key))
    _hit_rate_chart(data.load_event_stats(key))

    with st.expander("Aggregates"):
        st.dataframe(frame.round(3), hide_index=True, key="timings_table")


LOAD_PHASES = {
    "read_verify_s": "read + verify",
    "validity_s": "header check",
    "deserialize_s": "deserialize",
    "create_context_s": "create context",
    "allocate_io_s": "allocate IO",
    "first_inference_s": "first inference",
}


def _hit_rate_chart(rows: list[dict[str, Any]]) -> None:
    """Serving processes' cache hit rate (`load_or_build`) per model and host, by day."""
    if not rows:
        st.info("Cache hit rates appear here once serving processes call load_or_build.")
        return
    frame = pd.DataFrame(rows)
    frame["model @ host"] = frame["model"] + " @ " + frame["host"]
    st.subheader("Cache hit rate of load_or_build, per model and host")
    st.plotly_chart(
        px.line(
            frame,
            x="day",
            y="hit_rate",
            color="model @ host",
            markers=True,
            hover_data=["calls", "hits"],
            range_y=[0, 1.05],
            height=320,
        ),
        key="timings_hit_rate_chart",
    )


def _load_charts(rows: list[dict[str, Any]] | None) -> None:
    """Load phases and cold (build) vs warm (load) start, from the test-load harness's aggregates."""
    if not rows:
        st.info("Load-phase timings appear here once engines have been test-loaded (Engines, Test-load).")
        return
    frame = pd.DataFrame(rows)
    frame["engine"] = frame["model"] + " " + frame["backend"] + " " + frame["precision"] + " " + frame["targets"]
    st.subheader("Load-phase timings (test-loads)")
    phases = [c for c in LOAD_PHASES if c in frame.columns]
    long = frame.melt(id_vars=["engine", "runs"], value_vars=phases, var_name="phase", value_name="seconds")
    long["phase"] = long["phase"].map(LOAD_PHASES)
    st.plotly_chart(
        px.bar(long, x="engine", y="seconds", color="phase", hover_data=["runs"], height=380),
        key="timings_load_chart",
    )
    if {"build_s", "load_s"} <= set(frame.columns):
        st.subheader("Cold start (build) against warm start (load)")
        both = frame[["engine", "build_s", "load_s"]].rename(
            columns={"build_s": "cold start: build", "load_s": "warm start: load"}
        )
        melted = both.melt(id_vars="engine", var_name="start", value_name="seconds").dropna()
        st.plotly_chart(
            px.bar(melted, x="engine", y="seconds", color="start", barmode="group", log_y=True, height=380),
            key="timings_cold_warm_chart",
        )
        st.caption("Log scale: a warm start loads the cached engine; a cold start builds it first.")
