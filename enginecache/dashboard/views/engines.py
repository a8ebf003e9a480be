"""Engines: the catalog filtered by model, backend, target, precision, status and date (one SQL
page at a time); an engine's every fingerprint and cache-key ingredient, sha256 and size,
builder log and lineage; Verify hash, Check compatibility per known host, Test-load (a job for a
worker that can load the engine) with its results, Download, Retire; and "why was this a miss?"."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from enginecache.core.backends.registry import backend_label
from enginecache.core.cachekey import diff_ingredients
from enginecache.core.plaintext import markdown_literal
from enginecache.core.precision.spec import PRECISIONS
from enginecache.core.shapetext import shape_text
from enginecache.dashboard import data
from enginecache.dashboard.live import link, live_section
from enginecache.dashboard.statuscolours import status_style
from enginecache.dashboard.urlstate import from_url, to_url, url_int, url_text
from enginecache.dashboard.views.build import make_request, target_options
from enginecache.dashboard.views.engineactions import actions
from enginecache.db.models import EngineStatus, JobStatus
from enginecache.service.builds import plan_build
from enginecache.service.context import AppContext
from enginecache.service.engines import engine_to_dict, get_engine
from enginecache.service.loadruns import list_load_runs
from enginecache.service.readmodels.engines import EngineFilter, ingredient_rows
from enginecache.service.readmodels.jobs import JobView, engine_test_loads, jobs_by_id
from enginecache.service.readmodels.models import model_lineage

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
    engine = data.attempt("cannot read the engine", get_engine, app, engine_id)
    if engine is None:
        return
    busy = engine.status == EngineStatus.PENDING or any(j.active for j in engine_test_loads(app, engine_id))
    live_section(_engine_page, key, engine_id, active=busy)


def _engine_page(key: data.CatalogKey, engine_id: int) -> bool:
    """Draws the engine as the catalog has it now; returns whether anything of it is still running."""
    app = data.get_app()
    engine = data.attempt("cannot read the engine", get_engine, app, engine_id)
    if engine is None:
        return False
    test_loads = engine_test_loads(app, engine_id)
    info = engine_to_dict(app, engine, detail=True)
    model = markdown_literal(str(info["model"]))
    st.subheader(f"Engine {engine_id}: {model} {engine.backend} {engine.precision} {engine.targets}")
    cols = st.columns(5)
    cols[0].metric("Status", engine.status)
    cols[1].metric("Size", data.fmt_bytes(engine.size_bytes))
    cols[2].metric("Build time", f"{engine.build_seconds:.2f} s" if engine.build_seconds is not None else "-")
    cols[3].metric(backend_label(engine.backend), engine.backend_version, help="the backend and its library version")
    cols[4].metric(
        "Verified",
        info["verified_at"][:10] if info["verified_at"] else "never",
        help=f"last re-hash {info['verified_at']} UTC" if info["verified_at"] else None,
    )
    st.markdown(
        f"**model** {link(str(info['model']), 'models', model=engine.model_id)}  \n"
        f"**sha256** `{engine.sha256 or '-'}`  \n**blake3** `{engine.blake3 or '-'}`  \n"
        f"**cache key** `{engine.cache_key}`  \n**blob** `{info['path'] or '-'}`"
    )
    if engine.error:
        st.error(markdown_literal(f"Build error: {engine.error}"))
    for warning in engine.warnings:
        st.caption(markdown_literal(f"note: {warning}"))

    actions(app, engine, info, test_loads)

    ingredients, loads, host, io, log, lineage, miss = st.tabs(
        ["Cache key", "Test-loads", "Build host", "IO", "Builder log", "Lineage", "Why was this a miss?"],
        key="engines_tabs",  # the tab chosen stays chosen while the page redraws itself (a test-load ending)
        on_change="rerun",
    )
    with loads:
        failed = [j for j in test_loads if j.job.status in (JobStatus.FAILED, JobStatus.DEAD)]
        # read now, not from a cache: the page's last redraw after a test-load ends must show its run
        _load_runs(list_load_runs(app, engine_id, limit=20), failed[0] if failed else None)
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


def _builder_log(app: AppContext, engine: Any) -> None:
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


LOAD_PHASE_LABELS = {
    "read_verify": "read + verify",
    "validity": "header check",
    "deserialize": "deserialize",
    "create_context": "create context",
    "allocate_io": "allocate IO",
    "first_inference": "first inference",
}


def _load_runs(runs: list[dict[str, Any]], failed: JobView | None) -> None:
    """The latest test-load: verdict, phases as a bar, latency distribution, accuracy per output;
    then every run in a table. A test-load job that failed without recording a run (newer than the
    last run) is shown first, with its reason."""
    latest_run = runs[0]["job_id"] if runs else None
    if failed is not None and (latest_run is None or failed.job.id > int(latest_run or 0)):
        job = failed.job
        st.error(
            markdown_literal(f"Test-load job {job.id} {job.status}: {job.error or 'no reason recorded'}"),
            icon=":material/error:",
        )
    if not runs:
        if failed is None:
            st.caption("No test-load yet: click Test-load to queue one on a worker that can load this engine.")
        return
    latest = runs[0]
    show = st.success if latest["verdict"] == "PASS" else st.error
    show(
        f"Latest test-load ({latest['created_at'][:19]} on {markdown_literal(latest['hostname'])}): "
        f"**{latest['verdict']}**. {markdown_literal(latest['reason'])}"
    )
    _inputs_used(latest)  # what it was fed, then how close its outputs came: before the timings
    if latest["accuracy"]:
        _accuracy(latest)
    if latest["phases"]:
        phases = pd.DataFrame(
            [{"phase": LOAD_PHASE_LABELS.get(k, k), "ms": v * 1e3} for k, v in latest["phases"].items()]
        )
        st.plotly_chart(
            px.bar(phases, x="ms", y="phase", orientation="h", height=260, title="Load phases (ms)"),
            key="engines_load_phases",
        )
    if latest["latency"]:
        lat = latest["latency"]
        cols = st.columns(5)
        for col, (label, name) in zip(
            cols, (("p50", "p50_ms"), ("p90", "p90_ms"), ("p99", "p99_ms"), ("mean", "mean_ms")), strict=False
        ):
            col.metric(f"{label} latency", f"{lat[name]:.3f} ms")
        cols[4].metric("throughput", f"{lat['throughput']:.1f}/s")
    if latest["samples_ms"]:
        st.plotly_chart(
            px.histogram(
                pd.DataFrame({"ms": latest["samples_ms"]}),
                x="ms",
                nbins=30,
                height=260,
                title=f"Latency over {len(latest['samples_ms'])} iterations",
            ),
            key="engines_load_latency",
        )
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "run": r["id"],
                    "when": r["created_at"][:19],
                    "host": r["hostname"],
                    "verdict": r["verdict"],
                    "load ms": None if r["load_seconds"] is None else round(r["load_seconds"] * 1e3, 3),
                    "p50 ms": (r["latency"] or {}).get("p50_ms"),
                    "reason": r["reason"],
                }
                for r in runs
            ]
        ),
        hide_index=True,
        key="engines_load_runs",
    )


def _inputs_used(run: dict[str, Any]) -> None:
    """What the run fed the engine: each input's shape, and an uploaded file or how it was generated."""
    made = (run.get("details") or {}).get("inputs") or {}
    shapes = run.get("input_shapes") or {}
    if not made and not shapes:
        return
    st.markdown("**Inputs used**")
    st.dataframe(
        pd.DataFrame(
            [
                {"input": name, "shape": shape_text(shapes.get(name) or ()), "made": str(made.get(name, "-"))}
                for name in dict.fromkeys([*shapes, *made])
            ]
        ),
        hide_index=True,
        key="engines_load_inputs",
    )


TOLERANCE_LABELS = {
    "atol": "atol",
    "rtol": "rtol",
    "min_cosine": "min cosine",
    "min_top1": "min top-1",
    "min_top5": "min top-5",
}


def _fmt(value: Any) -> str:
    return "-" if value is None else f"{value:.6g}" if isinstance(value, float) else str(value)


def _accuracy(run: dict[str, Any]) -> None:
    """Per output: PASS or FAIL, its errors against the reference, and the tolerances it was judged by
    (the precision's, with the run's overrides and any per-output ones)."""
    tolerances = dict(run.get("tolerances") or {})
    per_output = tolerances.pop("per_output", {}) or {}
    used = ", ".join(f"{TOLERANCE_LABELS.get(k, k)} {_fmt(v)}" for k, v in tolerances.items())
    st.markdown(f"**Accuracy against ONNX Runtime on the source fp32 model** ({run['precision']} tolerances: {used})")
    rows = []
    for out in run["accuracy"]:
        own = {**tolerances, **per_output.get(out.get("name"), {})}
        rows.append(
            {
                "output": out.get("name"),
                "verdict": "PASS" if out.get("passed") else "FAIL",
                "shape": shape_text(out.get("shape") or ()),
                "max abs err": _fmt(out.get("max_abs")),
                "atol": _fmt(own.get("atol")),
                "max rel err": _fmt(out.get("max_rel")),
                "rtol": _fmt(own.get("rtol")),
                "cosine": _fmt(out.get("cosine")),
                "min cosine": _fmt(own.get("min_cosine")),
                "top-1": _fmt(out.get("top1")),
                "failed checks": "; ".join(out.get("failed_checks") or []),
            }
        )
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="engines_load_accuracy")


def _lineage(app: AppContext, engine: Any) -> None:
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


def _why_miss(app: AppContext, key: data.CatalogKey, engine: Any) -> None:
    st.caption("Compare this engine's cache key with another engine's, or with a build request.")
    mode = st.radio("Compare with", ["another engine", "a build request"], horizontal=True, key="engines_miss_mode")
    if mode == "another engine":
        other_id = st.number_input("Other engine id", min_value=1, step=1, value=None, key="engines_miss_other")
        if other_id is None:
            return
        other = data.attempt("cannot read the other engine", get_engine, app, int(other_id))
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
