"""Audit: every change (models registered or repaired, builds and test-loads submitted, jobs
cancelled, engines retired, anything marked CORRUPT), newest first, with who made it, when and from
where; filtered by action. What each change moved reads `field: old -> new`, the other details
`field: value` (`service.access.auditdiff`), never raw JSON; one event of the page is shown whole
below the table. Every string in it came from someone: shown in tables (plain text) or escaped
inside Markdown (`service.readmodels.display.markdown_literal`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.service.access import audit
from enginecache.service.access.auditdiff import readable_details
from enginecache.service.readmodels.display import markdown_literal

ANY = "(any)"
PAGE_SIZES = (100, 500, 1000)


@st.cache_data(ttl=data.LIST_TTL, show_spinner=False)
def _actions(key: data.CatalogKey) -> list[str]:
    return audit.audit_actions(data.get_app())


@st.cache_data(ttl=data.LIVE_TTL, show_spinner=False)
def _events(key: data.CatalogKey, action: str | None, limit: int, offset: int) -> list[dict[str, Any]]:
    return [audit.audit_dict(e) for e in audit.list_audit(data.get_app(), action=action, limit=limit, offset=offset)]


def _row(event: dict[str, Any]) -> dict[str, Any]:
    readable = readable_details(event["action"], event["details"])
    return {
        "id": event["id"],
        "at (UTC)": event["at"][:19].replace("T", " "),
        "actor": event["actor"],
        "origin": event["origin"],
        "action": event["action"],
        "target": event["target"],
        "change": readable.change,
        "details": readable.rest,
    }


def render() -> None:
    st.title("Audit")
    if not data.may("roles"):  # the router lists this view for admins only; a link to it says so too
        st.error("The audit log is for admins.", icon=":material/block:")
        return
    key = data.catalog_key()
    me = audit.current_actor()
    st.caption(
        "Every change, newest first: who made it, when and from where. The log is append-only: the "
        f"database refuses to change or delete its rows. Changes you make here are recorded as "
        f"{markdown_literal(me.name)} ({markdown_literal(me.origin)})."
    )
    cols = st.columns([3, 1, 1])
    with cols[0]:
        chosen = st.selectbox("Action", [ANY, *_actions(key)], key="audit_action")
    with cols[1]:
        size = int(st.selectbox("Rows per page", PAGE_SIZES, key="audit_page_size"))
    with cols[2]:
        page = int(st.number_input("Page", min_value=1, value=1, step=1, key="audit_page"))
    action = None if chosen == ANY else str(chosen)
    events = _events(key, action, size, (page - 1) * size)
    if not events:
        st.info("No change recorded yet." if action is None and page == 1 else "No event on this page.")
        return
    st.dataframe(
        pd.DataFrame([_row(e) for e in events]),
        hide_index=True,
        height="content",
        key="audit_table",
        column_config={"change": st.column_config.TextColumn(width=260)},  # an alias move, whole
    )
    _one_event(events)


def _one_event(events: list[dict[str, Any]]) -> None:
    """One event of the page whole: a table cell cuts a long reason short."""
    by_id = {e["id"]: e for e in events}
    chosen = st.selectbox(
        "Event in full",
        list(by_id),
        format_func=lambda i: f"{i}: {by_id[i]['action']} {by_id[i]['target']}",
        key="audit_event",
    )
    event = by_id[chosen]
    lines = readable_details(event["action"], event["details"]).lines() or ["no details"]
    head = f"**{markdown_literal(event['actor'])}** ({markdown_literal(event['origin'])}), {event['at'][:19]}"
    st.markdown("\n".join([head, "", *(f"- {markdown_literal(line)}" for line in lines)]))
