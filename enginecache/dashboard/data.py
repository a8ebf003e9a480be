"""Shared dashboard plumbing: the AppContext (one per catalog, `st.cache_resource`), cached
queries (`st.cache_data` with short TTLs, keyed by the catalog), and error display.

Views call the service layer only through here or directly; nothing here builds or loads an
engine: builds and test-loads are jobs, claimed by workers.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import streamlit as st

from enginecache.errors import EngineCacheError
from enginecache.service.access import audit
from enginecache.service.access.roles import Role, allowed, role_of
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from enginecache.service.engines import loadruns
from enginecache.service.readmodels import engines, hosts, models, overview, timings
from enginecache.service.readmodels.display import markdown_literal

logger = logging.getLogger(__name__)

T = TypeVar("T")
CatalogKey = tuple[str, str]  # (home, db url): what cached queries are keyed by

# Errors a user can act on: shown with their message. Anything else is shown with its type too.
EXPECTED_ERRORS: tuple[type[BaseException], ...] = (EngineCacheError, OSError, ValueError)

LIVE_TTL = 2.0  # counts, jobs: what changes while you watch
LIST_TTL = 3.0  # lists and pages
CHART_TTL = 30.0  # aggregates for charts


def catalog_key() -> CatalogKey:
    """The catalog this process serves: ENGINECACHE_HOME and ENGINECACHE_DB_URL (as the CLI)."""
    ctx = AppContext.from_settings(os.environ.get(HOME_ENV), os.environ.get(DB_URL_ENV))
    return (str(ctx.home), ctx.db_url)


def start_view(title: str, rows_of: Callable[[CatalogKey], list[T]], empty: str) -> tuple[CatalogKey, list[T]]:
    """A view's title, the catalog it reads, and the rows it is about (`rows_of(key)`); where there
    are none, `empty` is shown in their place and the rows come back empty: the view stops there."""
    st.title(title)
    key = catalog_key()
    rows = rows_of(key)
    if not rows:
        st.info(empty)
    return key, rows


@st.cache_resource(show_spinner=False)
def _open_app(home: str, db_url: str) -> AppContext:
    return AppContext.from_settings(home, db_url)


def get_app() -> AppContext:
    """The AppContext (catalog engine and store) of this process, opened once per catalog."""
    return _open_app(*catalog_key())


ROLE_STATE = "enginecache_role"  # = dashboard.app.ROLE_STATE: this run's role, set by the router


def current_role() -> Role | None:
    """The role of whoever this run acts for: what the router read at the top of this run (it reads
    it again on every rerun), else (a view run on its own) the current actor's, read now. Views
    hide what it may not do; the service layer checks again on every call."""
    if ROLE_STATE in st.session_state:
        value = st.session_state[ROLE_STATE]
        return Role(value) if value is not None else None
    return role_of(get_app(), audit.current_actor())


def may(permission: str) -> bool:
    """Whether this run's role allows `permission` (a `service.access.roles.PERMISSIONS` key)."""
    return allowed(current_role(), permission)


def clear_caches() -> None:
    """After a write (submit, cancel, verify, retire, upload): the next read sees it."""
    st.cache_data.clear()


def show_error(err: BaseException, what: str = "") -> None:
    """The failure as literal text: messages quote names and paths from uploaded files, so no
    Markdown in them may render (a link, an image the browser would fetch)."""
    prefix = f"{what}: " if what else ""
    if isinstance(err, EXPECTED_ERRORS):
        st.error(markdown_literal(f"{prefix}{err}"), icon=":material/error:")
    else:
        logger.exception("dashboard error")
        st.error(markdown_literal(f"{prefix}{type(err).__name__}: {err}"), icon=":material/error:")


def attempt(what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T | None:
    """Run a service call; on failure show the reason with `st.error` and return None."""
    try:
        return fn(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - every failure is shown to the operator with its reason
        show_error(err, what)
        return None


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


# -- cached queries (keyed by the catalog, so tests with temp catalogs never share results) ---


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def counts(key: CatalogKey) -> overview.CatalogCounts:
    return overview.catalog_counts(_open_app(*key))


@st.cache_data(ttl=CHART_TTL, show_spinner=False)
def cache_activity(key: CatalogKey, days: int) -> list[overview.CacheDay]:
    return overview.cache_activity(_open_app(*key), days=days)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def recent_failures(key: CatalogKey, limit: int) -> list[overview.Failure]:
    return overview.recent_failures(_open_app(*key), limit=limit)


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def model_rows(key: CatalogKey, search: str | None = None) -> list[models.ModelRow]:
    """Models, newest first; `search`: by name or digest prefix."""
    return models.model_rows(_open_app(*key), search=search)


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def working_precisions(key: CatalogKey, model_id: int) -> tuple[str, ...]:
    return models.working_precisions(_open_app(*key), model_id)


@st.cache_data(ttl=LIST_TTL, show_spinner=False)
def filter_options(key: CatalogKey) -> engines.FilterOptions:
    return engines.engine_filter_options(_open_app(*key))


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def engine_page(key: CatalogKey, spec: engines.EngineFilter, offset: int, limit: int) -> engines.EnginePage:
    return engines.engine_page(_open_app(*key), spec, offset=offset, limit=limit)


@st.cache_data(ttl=CHART_TTL, show_spinner=False)
def build_time_groups(key: CatalogKey) -> list[timings.BuildTimeGroup]:
    return timings.build_time_groups(_open_app(*key))


@st.cache_data(ttl=CHART_TTL, show_spinner=False)
def cold_warm_starts(key: CatalogKey, days: int) -> list[timings.ColdWarm]:
    """Recorded build seconds against recorded `load_or_build` cache hits of the same engines."""
    return timings.cold_warm_starts(_open_app(*key), days=days)


@st.cache_data(ttl=CHART_TTL, show_spinner=False)
def load_phase_stats(key: CatalogKey) -> list[dict[str, Any]]:
    """Mean seconds per load phase by model x backend x targets x precision, beside build time."""
    return loadruns.load_phase_stats(_open_app(*key))


@st.cache_data(ttl=CHART_TTL, show_spinner=False)
def serving_hit_rates(key: CatalogKey, days: int, pairs: int) -> timings.HitRates:
    """`load_or_build` calls and hit rate per day of the busiest (model, host) pairs."""
    return timings.serving_hit_rates(_open_app(*key), days=days, pairs=pairs)


@st.cache_data(ttl=LIVE_TTL, show_spinner=False)
def worker_hosts(key: CatalogKey) -> list[hosts.HostRow]:
    return hosts.worker_hosts(_open_app(*key))
