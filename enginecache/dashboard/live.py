"""What stays current on its own: sections drawn as fragments that rerun from the catalog every
REFRESH_SECONDS while anything they show is running (`st.fragment(run_every=...)`), and stop once
nothing is; links between views (`?engine=ID`, `?model=ID`) as plain text inside Markdown.

A live section that finds nothing running any more reruns the whole page once (`st.rerun()`), so
what depends on the finished work outside it (the Build matrix, an engine's status) is drawn
again from the catalog and the timer stops."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

import streamlit as st

from enginecache.service.readmodels.display import markdown_literal

REFRESH_SECONDS = 2.0


def refresh_every(active: bool) -> float | None:
    """The rerun interval of a live section: REFRESH_SECONDS while something it shows runs, else none."""
    return REFRESH_SECONDS if active else None


def live_section(body: Callable[..., bool], *args: Any, active: bool) -> None:
    """Draw `body(*args)` as a fragment rerun every REFRESH_SECONDS while `active`; `body` returns
    whether anything it drew is still running. A rerun that finds nothing running reruns the page."""

    def section(*inner: Any) -> None:
        running = body(*inner)
        if active and not running and _in_own_rerun():
            st.rerun()

    section.__qualname__ = section.__name__ = f"live_{body.__name__}"
    section.__module__ = body.__module__
    st.fragment(section, run_every=refresh_every(active))(*args)


def _in_own_rerun() -> bool:
    """Whether this script run is a fragment's own rerun (not the page's full run)."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx(suppress_warning=True)
    return bool(ctx is not None and ctx.fragment_ids_this_run)


def link(text: str, page: str, **params: int | str) -> str:
    """A Markdown link to another view (`engines`, `models`), its text shown as plain text."""
    query = f"?{urlencode(params)}" if params else ""
    return f"[{markdown_literal(text)}]({page}{query})"
