"""Engines: the catalog filtered by model, backend, target, precision, status and date (one SQL
page at a time); an engine's every fingerprint and cache-key ingredient, sha256 and size,
builder log and lineage; where it came from (built here, imported, an imported bundle) and, for a
TensorRT-RTX engine, the runtime caches the fleet published for it per GPU; Verify hash, Check
compatibility per known host, Test-load (a job for a worker that can load the engine) with its
results, Download, Retire; and "why was this a miss?"."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.live import link, live_section
from enginecache.dashboard.statuscolours import status_style
from enginecache.dashboard.urlstate import from_url, to_url, url_int, url_text
from enginecache.dashboard.views.build import make_request, target_options
from enginecache.dashboard.views.engineactions import actions
from enginecache.dashboard.views.engineimport import import_form
from enginecache.dashboard.views.enginetestloads import load_runs
from enginecache.dashboard.views.runtimecachetable import cache_table
from enginecache.service.builds.plan import plan_build
from enginecache.service.builds.views import PRECISIONS, backend_label, diff_ingredients
from enginecache.service.context import AppContext
from enginecache.service.engines.detail import EngineDetail, engine_detail
from enginecache.service.engines.loadruns import list_load_runs
from enginecache.service.engines.provenance import provenance_kind, provenance_lines
from enginecache.service.fleet.runtimecaches import has_runtime_caches, runtime_cache_rows
from enginecache.service.models.detail import model_release
from enginecache.service.readmodels.display import markdown_literal, shape_text
from enginecache.service.readmodels.engines import EngineFilter, ingredient_rows
from enginecache.service.readmodels.jobs import engine_test_loads, jobs_by_id
from enginecache.service.readmodels.models import model_lineage
from enginecache.service.readmodels.statuses import EngineStatus, JobStatus

PAGE_SIZE = 50
ANY = "(any)"


FILTER_PARAMS = (  # (widget key, URL parameter)
    ("engines_f_search", "q"),
    ("engines_f_model", "model"),
    ("engines_f_backend", "backend"),
    ("engines_f_target", "target"),
    ("engines_f_precision", "precision"),
    ("engines_f_status", "status"),
)


def _choice(label: str, options: list[Any], key: str, param: str, fmt: Any = str, parse: Any = url_text) -> Any:
    from_url(key, param, parse, options)
    value = st.selectbox(label, [ANY, *options], key=key, format_func=lambda v: ANY if v == ANY else fmt(v))
    chosen = None if value == ANY else value
    to_url(param, chosen)
    return chosen


def _filters(key: data.CatalogKey) -> EngineFilter:
    opts = data.filter_options(key)
    names = dict(opts.models)
    from_url("engines_f_search", "q")
    search = st.text_input(
        "Search", key="engines_f_search", placeholder="model name, or a digest or sha256 prefix"
    ).strip()
    to_url("q", search)
    cols = st.columns(6)
    with cols[0]:
        model_id = _choice("Model", [i for i, _ in opts.models], "engines_f_model", "model", names.get, url_int)
    with cols[1]:
        backend = _choice("Backend", opts.backends, "engines_f_backend", "backend")
    with cols[2]:
        target = _choice("Target", opts.targets, "engines_f_target", "target")
    with cols[3]:
        precision = _choice("Precision", opts.precisions, "engines_f_precision", "precision")
    with cols[4]:
        status = _choice("Status", opts.statuses, "engines_f_status", "status")
    with cols[5]:
        days = st.date_input("Created between", value=[], key="engines_f_dates")
    since = until = None
    if isinstance(days, (list, tuple)) and len(days) == 2 and all(isinstance(d, date) for d in days):
        since = datetime.combine(days[0], time.min, tzinfo=UTC)
        until = datetime.combine(days[1], time.min, tzinfo=UTC) + timedelta(days=1)
    return EngineFilter(
        model_id=model_id,
        backend=backend,
        precision=precision,
        status=status,
        target=target,
        since=since,
        until=until,
        search=search or None,
    )


def render() -> None:
    st.title("Engines")
    app = data.get_app()
    _engines(app)
    import_form(app)  # last: the engine page's own uploader (test-load inputs) comes first


def _engines(app: AppContext) -> None:
    key = data.catalog_key()
    spec = _filters(key)
    last = st.session_state.get("engines_last_filter")
    if last != spec:
        st.session_state["engines_last_filter"] = spec
        st.session_state["engines_page"] = 1
        if last is not None:  # the filters changed: the engine the URL named no longer leads
            st.session_state.pop("engines_detail", None)
            to_url("engine", None)
    page_no = int(st.session_state.get("engines_page", 1))
    page = data.engine_page(key, spec, (page_no - 1) * PAGE_SIZE, PAGE_SIZE)
    pages = max(1, -(-page.total // PAGE_SIZE))
    st.caption(f"{page.total:,d} engine(s) match; page {page_no} of {pages}, newest first.")
    if page.rows:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "id": r.id,
                        "link": f"engines?engine={r.id}",
                        "model": r.model,
                        "backend": r.backend,
                        "precision": r.precision,
                        "targets": r.targets,
                        "status": r.status,
                        "size": data.fmt_bytes(r.size_bytes),
                        "build s": round(r.build_seconds, 2) if r.build_seconds is not None else None,
                        "sha256": (r.sha256 or "")[:16],
                        "created": r.created_at,
                    }
                    for r in page.rows
                ]
            ).style.map(status_style, subset=["status"]),
            hide_index=True,
            height="content",  # a page of rows shown whole: no box of ten rows to scroll inside
            key="engines_table",
            column_config={"link": st.column_config.LinkColumn("open", display_text="open")},
        )
    if pages > 1:
        st.number_input("Page", 1, pages, key="engines_page")

    ids = [r.id for r in page.rows]
    wanted = st.query_params.get("engine")
    if wanted and wanted.isdigit() and int(wanted) not in ids:
        ids.insert(0, int(wanted))
    if not ids:
        if page.total == 0 and spec == EngineFilter():  # nothing filtered away: there are none
            st.info("No engines yet: build one under Build (or from the Coverage matrix).")
        elif page.total == 0:
            st.info("No engines match: clear a filter or the search.")
        return
    labels = {r.id: f"{r.id}: {r.model} {r.backend} {r.precision} {r.targets} {r.status}" for r in page.rows}
    if st.session_state.get("engines_detail") not in ids:
        st.session_state.pop("engines_detail", None)  # filtered away: fall back to the newest
    if wanted and wanted.isdigit() and "engines_detail" not in st.session_state:
        st.session_state["engines_detail"] = int(wanted)  # a link to one engine opens it
    chosen = st.selectbox("Engine", ids, format_func=lambda i: labels.get(i, f"engine {i}"), key="engines_detail")
    to_url("engine", chosen)
    st.divider()
    _detail(app, key, int(chosen))


def _detail(app: AppContext, key: data.CatalogKey, engine_id: int) -> None:
    """The engine's page, a live section while it is PENDING or one of its test-loads is queued or
    running: its status, test-loads and results are redrawn from the catalog until they settle."""
    engine = data.attempt("cannot read the engine", engine_detail, app, engine_id)
    if engine is None:
        return
    busy = engine.status == EngineStatus.PENDING or any(j.active for j in engine_test_loads(app, engine_id))
    live_section(_engine_page, key, engine_id, active=busy)


def _engine_page(key: data.CatalogKey, engine_id: int) -> bool:
    """Draws the engine as the catalog has it now; returns whether anything of it is still running."""
    app = data.get_app()
    engine = data.attempt("cannot read the engine", engine_detail, app, engine_id)
    if engine is None:
        return False
    test_loads = engine_test_loads(app, engine_id)
    model = markdown_literal(str(engine.model))
    st.subheader(f"Engine {engine_id}: {model} {engine.backend} {engine.precision} {engine.targets}")
    cols = st.columns(5)
    cols[0].metric("Status", engine.status)
    cols[1].metric("Size", data.fmt_bytes(engine.size_bytes))
    cols[2].metric("Build time", f"{engine.build_seconds:.2f} s" if engine.build_seconds is not None else "-")
    cols[3].metric(backend_label(engine.backend), engine.backend_version, help="the backend and its library version")
    cols[4].metric(
        "Verified",
        engine.verified_at[:10] if engine.verified_at else "never",
        help=f"last full read matched its digest (verify or a test-load) at {engine.verified_at} UTC"
        if engine.verified_at
        else None,
    )
    st.markdown(
        f"**model** {link(str(engine.model), 'models', model=engine.model_id)}{_aliases(app, engine)}  \n"
        f"**sha256** `{engine.sha256 or '-'}`  \n**blake3** `{engine.blake3 or '-'}`  \n"
        f"**cache key** `{engine.cache_key}`  \n**blob** `{engine.path or '-'}`  \n"
        f"**provenance** {provenance_kind(engine.provenance)}"
    )
    if engine.provenance.get("kind") == "imported":
        for line in provenance_lines(engine.provenance)[1:]:
            st.caption(markdown_literal(line.strip()))
    if has_runtime_caches(engine.backend):
        _runtime_caches(app, engine_id)
    if engine.error:
        st.error(markdown_literal(f"Build error: {engine.error}"))
    for warning in engine.warnings:
        st.caption(markdown_literal(f"note: {warning}"))

    # read now, not from a cache: the page's last redraw after a test-load ends must show its run
    runs = list_load_runs(app, engine_id, limit=20)
    actions(app, engine, test_loads, runs)

    ingredients, loads, host, io, log, lineage, miss = st.tabs(
        ["Cache key", "Test-loads", "Build host", "IO", "Builder log", "Lineage", "Why was this a miss?"],
        key="engines_tabs",  # the tab chosen stays chosen while the page redraws itself (a test-load ending)
        on_change="rerun",
    )
    with loads:
        failed = [j for j in test_loads if j.job.status in (JobStatus.FAILED, JobStatus.DEAD)]
        load_runs(runs, failed[0] if failed else None)
    with ingredients:
        st.dataframe(
            pd.DataFrame(
                [
                    {"ingredient": name, "value": json.dumps(value, sort_keys=True, default=str)}
                    for name, value in ingredient_rows(engine.key_ingredients)
                ]
            ),
            hide_index=True,
            key="engines_ingredients",
        )
        st.markdown("**Precision recipe**")
        st.json(engine.precision_recipe, expanded=False)
        st.markdown("**Build options**")
        st.json(engine.build_options, expanded=False)
    with host:
        st.json(engine.host, expanded=True)
    with io:
        if engine.io:
            frame = pd.DataFrame(engine.io).astype(str)
            if "shape" in frame:
                frame["shape"] = [shape_text(t.get("shape") or ()) for t in engine.io]
            st.dataframe(frame, hide_index=True, key="engines_io")
        else:
            st.caption("No IO recorded (the engine was not built).")
    with log:
        _builder_log(app, engine)
    with lineage:
        _lineage(app, engine)
    with miss:
        _why_miss(app, key, engine)
    return engine.status == EngineStatus.PENDING or any(j.active for j in test_loads)


def _runtime_caches(app: AppContext, engine_id: int) -> None:
    """The runtime caches published for this TensorRT-RTX engine, one row per GPU key (docs/fleet.md)."""
    rows = data.attempt("cannot read the runtime caches", runtime_cache_rows, app, engine_id=engine_id)
    if rows is None:
        return
    gpus = len({(r["gpu_sku"], r["compute_capability"]) for r in rows})
    cache_table(
        f"**Runtime caches per GPU** ({len(rows)} published, {gpus} GPU(s))",
        rows,
        key="engines_runtime_caches",
        when_empty="None published yet: a host that serves it publishes the kernels it compiled for its GPU "
        f"(`enginecache runtime-cache publish {engine_id} FILE`); other hosts of the same SM then skip that compile.",
        with_engine=False,
    )


def _builder_log(app: AppContext, engine: EngineDetail) -> None:
    """The builder's log; for a FAILED engine, or one whose build left no log, its job's log tail too."""
    if engine.builder_log:
        st.code(engine.builder_log, language=None)
    if engine.builder_log and engine.status != EngineStatus.FAILED:
        return
    jobs = jobs_by_id(app, [engine.job_id]) if engine.job_id else []
    if jobs and jobs[0].log_tail:
        st.caption(f"The log tail of job {engine.job_id}, which built it:")
        st.code(jobs[0].log_tail, language=None)
    elif not engine.builder_log:
        st.code("(empty)", language=None)


def _aliases(app: AppContext, engine: EngineDetail) -> str:
    """`, version N, aliases prod, canary for sm86`: the release of the engine's model (plain text)."""
    release = data.attempt("cannot read the model", model_release, app, engine.model_id)
    if release is None:
        return ""
    pointing = [a.alias + (f" for {a.gpu_class}" if a.gpu_class else "") for a in release.aliases]
    text = f", version {release.version}" + (f", aliases {', '.join(pointing)}" if pointing else "")
    return markdown_literal(text)


def _lineage(app: AppContext, engine: EngineDetail) -> None:
    lineage = data.attempt("cannot read the lineage", model_lineage, app, engine.model_id)
    if lineage is None:
        return
    source = lineage.source
    variant = next((v for v in lineage.variants if v.id == engine.variant_model_id), None)
    lines = [f"- source model **{link(source.name, 'models', model=source.id or 0)}** (`{source.digest[:16]}`)"]
    if variant is not None:
        name = link(variant.name, "models", model=variant.id or 0)
        lines.append(f"  - converted **{name}** (`{variant.digest[:16]}`)")
    indent = "    " if variant is not None else "  "
    lines.append(
        f"{indent}- engine **{engine.id}** {engine.status}" + (f", job {engine.job_id}" if engine.job_id else "")
    )
    st.markdown("\n".join(lines))


def _why_miss(app: AppContext, key: data.CatalogKey, engine: EngineDetail) -> None:
    st.caption("Compare this engine's cache key with another engine's, or with a build request.")
    mode = st.radio("Compare with", ["another engine", "a build request"], horizontal=True, key="engines_miss_mode")
    if mode == "another engine":
        other_id = st.number_input("Other engine id", min_value=1, step=1, value=None, key="engines_miss_other")
        if other_id is None:
            return
        other = data.attempt("cannot read the other engine", engine_detail, app, int(other_id))
        if other is None:
            return
        right, label = other.key_ingredients, f"engine {other.id}"
    else:
        options = target_options(data.worker_hosts(key))
        by_label = {t.label: t for t in options}
        cols = st.columns(2)
        target_label = cols[0].selectbox("Target", list(by_label), key="engines_miss_target")
        precision = cols[1].selectbox("Precision", list(PRECISIONS), key="engines_miss_precision")
        request = make_request(engine.model_id, by_label[target_label], precision, {})
        plan = data.attempt("cannot plan that request", plan_build, app, request)
        if plan is None:
            return
        right, label = plan.ingredients, f"request {target_label} {precision}"
    diffs = diff_ingredients(engine.key_ingredients, right)
    if not diffs:
        st.success(markdown_literal(f"Same cache key as {label}: a request for it is a hit on engine {engine.id}."))
        return
    st.warning(markdown_literal(f"{len(diffs)} key field(s) differ between engine {engine.id} and {label}:"))
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "field": d.field,
                    f"engine {engine.id}": json.dumps(d.left, default=str),
                    label: json.dumps(d.right, default=str),
                }
                for d in diffs
            ]
        ),
        hide_index=True,
        key="engines_miss_diff",
    )
