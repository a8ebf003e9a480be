"""An engine's Test-loads tab: the latest run's verdict, the inputs it used, the accuracy per output
beside the tolerance each was judged by, the load phases, latency percentiles and histogram, and
the earlier runs; a test-load job that failed without recording a run is shown with its reason."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.express as px
import streamlit as st

from enginecache.service.readmodels.display import markdown_literal, shape_text
from enginecache.service.readmodels.jobs import JobView

LOAD_PHASE_LABELS = {
    "read_verify": "read + verify",
    "validity": "header check",
    "deserialize": "deserialize",
    "create_context": "create context",
    "allocate_io": "allocate IO",
    "first_inference": "first inference",
}


def load_runs(runs: list[dict[str, Any]], failed: JobView | None) -> None:
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
