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
from enginecache.core.precision.spec import PRECISIONS
from enginecache.dashboard import data
from enginecache.dashboard.views.build import make_request, target_options
from enginecache.db.models import EngineStatus
from enginecache.service import engines
from enginecache.service.builds import plan_build
from enginecache.service.context import AppContext
from enginecache.service.engines import engine_to_dict, get_engine, verify_engines
from enginecache.service.jobs import waiting_reason
from enginecache.service.readmodels.engines import EngineFilter, ingredient_rows
from enginecache.service.readmodels.models import model_lineage
from enginecache.service.testload import submit_test_load

PAGE_SIZE = 50
ANY = "(any)"


def _choice(label: str, options: list[Any], key: str, fmt: Any = str) -> Any:
    value = st.selectbox(label, [ANY, *options], key=key, format_func=lambda v: ANY if v == ANY else fmt(v))
    return None if value == ANY else value


def _filters(key: data.CatalogKey) -> EngineFilter:
    opts = data.filter_options(key)
    names = dict(opts.models)
    cols = st.columns(6)
    with cols[0]:
        model_id = _choice("Model", [i for i, _ in opts.models], "engines_f_model", lambda i: f"{names[i]} ({i})")
    with cols[1]:
        backend = _choice("Backend", opts.backends, "engines_f_backend")
    with cols[2]:
        target = _choice("Target", opts.targets, "engines_f_target")
    with cols[3]:
        precision = _choice("Precision", opts.precisions, "engines_f_precision")
    with cols[4]:
        status = _choice("Status", opts.statuses, "engines_f_status")
    with cols[5]:
        days = st.date_input("Created between", value=[], key="engines_f_dates")
    since = until = None
    if isinstance(days, (list, tuple)) and len(days) == 2 and all(isinstance(d, date) for d in days):
        since = datetime.combine(days[0], time.min, tzinfo=UTC)
        until = datetime.combine(days[1], time.min, tzinfo=UTC) + timedelta(days=1)
    return EngineFilter(
        model_id=model_id, backend=backend, precision=precision, status=status, target=target, since=since, until=until
    )


def render() -> None:
    st.title("Engines")
    app = data.get_app()
    key = data.catalog_key()
    spec = _filters(key)
    if st.session_state.get("engines_last_filter") != spec:
        st.session_state["engines_last_filter"] = spec
        st.session_state["engines_page"] = 1
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
            ),
            hide_index=True,
            key="engines_table",
        )
    if pages > 1:
        st.number_input("Page", 1, pages, key="engines_page")

    ids = [r.id for r in page.rows]
    wanted = st.query_params.get("engine")
    if wanted and wanted.isdigit() and int(wanted) not in ids:
        ids.insert(0, int(wanted))
    if not ids:
        st.info("No engines match." if page.total == 0 else "")
        return
    labels = {r.id: f"{r.id}: {r.model} {r.backend} {r.precision} {r.targets} {r.status}" for r in page.rows}
    if st.session_state.get("engines_detail") not in ids:
        st.session_state.pop("engines_detail", None)  # filtered away: fall back to the newest
    if wanted and wanted.isdigit() and "engines_detail" not in st.session_state:
        st.session_state["engines_detail"] = int(wanted)  # a link to one engine opens it
    chosen = st.selectbox("Engine", ids, format_func=lambda i: labels.get(i, f"engine {i}"), key="engines_detail")
    st.divider()
    _detail(app, key, int(chosen))


def _detail(app: AppContext, key: data.CatalogKey, engine_id: int) -> None:
    engine = data.attempt("cannot read the engine", get_engine, app, engine_id)
    if engine is None:
        return
    info = engine_to_dict(app, engine, detail=True)
    st.subheader(f"Engine {engine_id}: {info['model']} {engine.backend} {engine.precision} {engine.targets}")
    cols = st.columns(5)
    cols[0].metric("Status", engine.status)
    cols[1].metric("Size", data.fmt_bytes(engine.size_bytes))
    cols[2].metric("Build time", f"{engine.build_seconds:.2f} s" if engine.build_seconds is not None else "-")
    cols[3].metric("Backend", f"{backend_label(engine.backend)} {engine.backend_version}")
    cols[4].metric(
        "Verified",
        info["verified_at"][:10] if info["verified_at"] else "never",
        help=f"last re-hash {info['verified_at']} UTC" if info["verified_at"] else None,
    )
    st.markdown(
        f"**sha256** `{engine.sha256 or '-'}`  \n**blake3** `{engine.blake3 or '-'}`  \n"
        f"**cache key** `{engine.cache_key}`  \n**blob** `{info['path'] or '-'}`"
    )
    if engine.error:
        st.error(f"Build error: {engine.error}")
    for warning in engine.warnings:
        st.caption(f"note: {warning}")

    _actions(app, engine_id, engine.status, info)

    ingredients, loads, host, io, log, lineage, miss = st.tabs(
        ["Cache key", "Test-loads", "Build host", "IO", "Builder log", "Lineage", "Why was this a miss?"]
    )
    with loads:
        _load_runs(data.load_runs(key, engine_id))
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
            st.dataframe(pd.DataFrame(engine.io).astype(str), hide_index=True, key="engines_io")
        else:
            st.caption("No IO recorded (the engine was not built).")
    with log:
        st.code(engine.builder_log or "(empty)", language=None)
    with lineage:
        _lineage(app, engine)
    with miss:
        _why_miss(app, key, engine)


def _actions(app: AppContext, engine_id: int, status: str, info: dict[str, Any]) -> None:
    cols = st.columns(5)
    if cols[0].button("Verify hash", key="engines_verify", disabled=info["sha256"] is None):
        results = data.attempt("verify failed", verify_engines, app, [engine_id])
        data.clear_caches()
        st.session_state["engines_verified"] = (engine_id, results or [])
    if cols[1].button("Check compatibility", key="engines_check"):
        verdicts = data.attempt("compatibility check failed", engines.engine_host_verdicts, app, engine_id)
        if verdicts is not None:
            st.session_state["engines_verdicts"] = (engine_id, verdicts)
    testable = status == EngineStatus.READY and data.may("test_load")
    if cols[2].button("Test-load", key="engines_testload", disabled=not testable):
        job = data.attempt("test-load not submitted", submit_test_load, app, engine_id)
        if job is not None:
            data.clear_caches()
            waiting = waiting_reason(app, job)
            st.success(
                f"test-load queued as job {job.id}" + (f" ({waiting})" if waiting else "; a capable worker runs it")
            )
    if info["path"] and status == EngineStatus.READY:
        path = info["path"]

        def read_blob() -> Any:
            return open(path, "rb")

        cols[3].download_button(
            "Download",
            data=read_blob,
            file_name=f"{info['model']}.{info['precision']}.{'-'.join(info['targets'])}.engine",
            mime="application/octet-stream",
            key="engines_download",
        )
    confirm = st.session_state.get("engines_retire_confirm") == engine_id
    if (
        status not in (EngineStatus.RETIRED,)
        and data.may("retire")
        and cols[4].button(
            "Confirm retire" if confirm else "Retire", key="engines_retire", type="primary" if confirm else "secondary"
        )
    ):
        if not confirm:
            st.session_state["engines_retire_confirm"] = engine_id
            st.rerun()
        if data.attempt("retire failed", engines.retire_engine, app, engine_id) is not None:
            st.session_state.pop("engines_retire_confirm", None)
            data.clear_caches()
            st.success(f"engine {engine_id} retired: cache lookups no longer return it")
    if confirm:
        st.warning(f"Retire engine {engine_id}? Click 'Confirm retire'. Its next request builds anew.")
    checked = st.session_state.get("engines_verified")
    if checked and checked[0] == engine_id:
        for result in checked[1]:
            show = st.success if result.ok else st.error
            show(f"engine {result.engine_id}: {result.status}, {result.message}")
    saved = st.session_state.get("engines_verdicts")
    if saved and saved[0] == engine_id:
        verdicts = saved[1]
        if not verdicts:
            st.info("No worker host is known yet: start `enginecache worker` (or `enginecache serve`).")
        else:
            icons = {"compatible": ":material/check_circle:", "incompatible": ":material/block:"}
            st.markdown(
                "\n".join(
                    f"- {icons.get(v.verdict, ':material/help:')} **{v.host}** "
                    f"({'online' if v.online else 'offline'}): **{v.verdict}**, {v.reason}"
                    for v in verdicts
                )
            )


LOAD_PHASE_LABELS = {
    "read_verify": "read + verify",
    "validity": "header check",
    "deserialize": "deserialize",
    "create_context": "create context",
    "allocate_io": "allocate IO",
    "first_inference": "first inference",
}


def _load_runs(runs: list[dict[str, Any]]) -> None:
    """The latest test-load: verdict, phases as a bar, latency distribution, accuracy per output;
    then every run in a table."""
    if not runs:
        st.caption("No test-load yet: click Test-load to queue one on a worker that can load this engine.")
        return
    latest = runs[0]
    show = st.success if latest["verdict"] == "PASS" else st.error
    show(
        f"Latest test-load ({latest['created_at'][:19]} on {latest['hostname']}): "
        f"**{latest['verdict']}**. {latest['reason']}"
    )
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
    if latest["accuracy"]:
        st.markdown("**Accuracy against ONNX Runtime on the source fp32 model**")
        st.dataframe(pd.DataFrame(latest["accuracy"]).astype(str), hide_index=True, key="engines_load_accuracy")
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


def _lineage(app: AppContext, engine: Any) -> None:
    lineage = data.attempt("cannot read the lineage", model_lineage, app, engine.model_id)
    if lineage is None:
        return
    variant = next((v for v in lineage.variants if v.id == engine.variant_model_id), None)
    lines = [f"- source model **{lineage.source.name}** (id {lineage.source.id}, `{lineage.source.digest[:16]}`)"]
    if variant is not None:
        lines.append(f"  - converted **{variant.name}** (id {variant.id}, `{variant.digest[:16]}`)")
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
        st.success(f"Same cache key as {label}: a request for it is a hit on engine {engine.id}.")
        return
    st.warning(f"{len(diffs)} key field(s) differ between engine {engine.id} and {label}:")
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
