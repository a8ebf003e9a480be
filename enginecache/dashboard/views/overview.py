"""Overview: counts of models, engines and jobs by status, workers online, cache hits and misses
per day, and the newest failures with their reasons."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from enginecache.dashboard import data
from enginecache.db.models import EngineStatus, JobStatus
from enginecache.service.readmodels.overview import CacheDay

FAILURES_SHOWN = 15
ACTIVITY_DAYS = 30


def render() -> None:
    st.title("Overview")
    key = data.catalog_key()
    counts = data.counts(key)

    cols = st.columns(4)
    cols[0].metric("Models", counts.source_models, help=f"{counts.models} including converted variants")
    cols[1].metric("Engines", counts.engines)
    cols[2].metric("Jobs", counts.jobs)
    cols[3].metric("Workers online", counts.workers_online, help=f"{counts.workers_total} known")
    if counts.workers_online == 0:
        st.warning("No worker is online: queued builds wait until one starts (`enginecache worker`).")

    left, right = st.columns(2)
    with left:
        st.subheader("Engines by status")
        st.dataframe(
            _status_frame(counts.engines_by_status, [s.value for s in EngineStatus]),
            hide_index=True,
            key="overview_engines",
        )
    with right:
        st.subheader("Jobs by status")
        st.dataframe(
            _status_frame(counts.jobs_by_status, [s.value for s in JobStatus]), hide_index=True, key="overview_jobs"
        )

    st.subheader(f"Cache activity, last {ACTIVITY_DAYS} days")
    days = data.cache_activity(key, ACTIVITY_DAYS)
    if days:
        st.plotly_chart(_activity_chart(days), key="overview_cache_chart")
        st.caption(
            "Builds are engines built (misses); build requests served from cache were answered with an "
            "existing engine (at submission, or by a job that found another job's engine); load_or_build "
            "hits and misses are serving processes' lookups."
        )
    else:
        st.info("No builds in the last 30 days.")

    st.subheader("Recent failures")
    failures = data.recent_failures(key, FAILURES_SHOWN)
    if failures:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "what": f"{f.source} {f.id}",
                        "status": f.status,
                        "when": f.when,
                        "request": f.what,
                        "reason": f.reason,
                    }
                    for f in failures
                ]
            ),
            hide_index=True,
            key="overview_failures",
        )
    else:
        st.success("No failed jobs or engines.")


SERIES = (
    ("builds (misses)", "misses"),
    ("build requests served from cache", "hits"),
    ("load_or_build hits", "serving_hits"),
    ("load_or_build misses", "serving_misses"),
)


def _activity_chart(days: list[CacheDay]) -> go.Figure:
    """Grouped bars per day, one trace per kind of event (plotly's graph objects: the first view a
    server renders does not import plotly express)."""
    x = [d.day for d in days]
    figure = go.Figure(
        [go.Bar(name=name, x=x, y=[getattr(d, field) for d in days]) for name, field in SERIES],
        layout={"barmode": "group", "height": 300, "xaxis": {"type": "category"}, "legend_title_text": "kind"},
    )
    figure.update_layout(margin={"t": 30})
    return figure


def _status_frame(by_status: dict[str, int], order: list[str]) -> pd.DataFrame:
    names = order + sorted(set(by_status) - set(order))
    return pd.DataFrame([{"status": s, "count": by_status.get(s, 0)} for s in names])
