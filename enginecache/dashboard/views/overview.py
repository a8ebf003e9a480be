"""Overview: counts of models, engines and jobs by status, workers online, cache hits and misses
per day, and the newest failures with their reasons."""

from __future__ import annotations

from datetime import date, timedelta

import pandas as pd
import plotly.express as px
import streamlit as st

from enginecache.dashboard import data
from enginecache.db.models import EngineStatus, JobStatus

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
    events = data.load_event_stats(key) or []
    if days or events:
        frame = pd.DataFrame(
            [{"day": d.day, "kind": "builds (misses)", "count": d.misses} for d in days]
            + [{"day": d.day, "kind": "build requests served from cache", "count": d.hits} for d in days]
            + [{"day": e["day"], "kind": "load_or_build hits", "count": int(e.get("hits") or 0)} for e in events]
            + [
                {"day": e["day"], "kind": "load_or_build misses", "count": int(e["calls"]) - int(e.get("hits") or 0)}
                for e in events
            ]
        )
        long = frame.groupby(["day", "kind"], as_index=False)["count"].sum()
        long = long[long["day"] >= str(date.today() - timedelta(days=ACTIVITY_DAYS))]
        fig = px.bar(long, x="day", y="count", color="kind", barmode="group", height=300)
        fig.update_xaxes(type="category")
        st.plotly_chart(fig, key="overview_cache_chart")
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


def _status_frame(by_status: dict[str, int], order: list[str]) -> pd.DataFrame:
    names = order + sorted(set(by_status) - set(order))
    return pd.DataFrame([{"status": s, "count": by_status.get(s, 0)} for s in names])
