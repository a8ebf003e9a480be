"""Overview: counts of models, engines and jobs by status, workers online, cache hits and misses
per day, and the newest failures with their reasons.

The router's default page, so the first one a new server process renders. It imports no pandas
(half a second of a first render; Streamlit's tables need it, so the status counts are markdown
tables with Streamlit's badges, not dataframes), and it imports plotly's graph objects in a thread
while its queries run (the database works with the GIL released)."""

from __future__ import annotations

import importlib
import threading
from typing import TYPE_CHECKING

import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.live import link
from enginecache.dashboard.statuscolours import status_badge
from enginecache.service.readmodels.display import markdown_literal
from enginecache.service.readmodels.overview import CacheDay, Failure
from enginecache.service.readmodels.statuses import EngineStatus, JobStatus

if TYPE_CHECKING:
    import plotly.graph_objects as go

FAILURES_SHOWN = 15
ACTIVITY_DAYS = 30
DRAWING_MODULES = ("plotly.graph_objects",)


def _import_meanwhile(names: tuple[str, ...]) -> threading.Thread | None:
    """Import `names` in a daemon thread where one is not imported yet (the first render of a process)."""
    import sys

    missing = [name for name in names if name not in sys.modules]
    if not missing:
        return None
    thread = threading.Thread(
        target=lambda: [importlib.import_module(name) for name in missing], name="overview-imports", daemon=True
    )
    thread.start()
    return thread


def render() -> None:
    importing = _import_meanwhile(DRAWING_MODULES)
    st.title("Overview")
    key = data.catalog_key()
    counts = data.counts(key)
    days = data.cache_activity(key, ACTIVITY_DAYS)
    failures = data.recent_failures(key, FAILURES_SHOWN)
    if importing is not None:
        importing.join()

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
        st.markdown(status_table(counts.engines_by_status, [s.value for s in EngineStatus]))
    with right:
        st.subheader("Jobs by status")
        st.markdown(status_table(counts.jobs_by_status, [s.value for s in JobStatus]))

    st.subheader(f"Cache activity, last {ACTIVITY_DAYS} days")
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
    if failures:
        st.caption("Newest first, each once: a build that failed is listed as its engine, which names its job.")
        for failure in failures:
            _failure(failure)
    else:
        st.success("No failed jobs or engines.")


def _failure(failure: Failure) -> None:
    """One failure: what failed (a link to an engine's page) and its whole reason, as plain text."""
    when = failure.when.strftime("%Y-%m-%d %H:%M UTC") if failure.when else "when unknown"
    name = f"{failure.source} {failure.id}"
    if failure.source == "engine":
        name = link(name, "engines", engine=failure.id)
    with st.container(border=True, key=f"overview_failure_{failure.source}_{failure.id}"):
        st.markdown(f"**{name}** · {failure.status} · {when} · {markdown_literal(failure.what)}")
        st.text(failure.reason)


SERIES = (
    ("builds (misses)", "misses"),
    ("build requests served from cache", "hits"),
    ("load_or_build hits", "serving_hits"),
    ("load_or_build misses", "serving_misses"),
)


def _activity_chart(days: list[CacheDay]) -> go.Figure:
    """Grouped bars per day, one trace per kind of event (plotly's graph objects: the first view a
    server renders does not import plotly express)."""
    import plotly.graph_objects as go

    x = [d.day for d in days]
    figure = go.Figure(
        [go.Bar(name=name, x=x, y=[getattr(d, field) for d in days]) for name, field in SERIES],
        layout={"barmode": "group", "height": 300, "xaxis": {"type": "category"}, "legend_title_text": "kind"},
    )
    figure.update_layout(margin={"t": 30})
    return figure


STATUS_TABLE_HEAD = "| status | count |\n| --- | ---: |"


def status_table(by_status: dict[str, int], order: list[str]) -> str:
    """Every status of `order` (then any other the catalog holds) with its count, as a markdown table:
    each status a badge of its colour, the word in it."""
    names = order + sorted(set(by_status) - set(order))
    return "\n".join([STATUS_TABLE_HEAD, *(f"| {status_badge(s)} | {by_status.get(s, 0):,} |" for s in names)])
