"""An engine's actions on the Engines view: Verify hash, Check compatibility, Test-load,
Download, Retire (with a confirmation); the engine's test-load jobs from the catalog.

A test-load's inputs are generated (`core.inputs`' shared generator, following the source model's
graph) or an uploaded .npz, checked against the engine's inputs before anything is queued
(`service.builds.testinputs`: names, dtypes, shapes within the profile; the problem named otherwise), then
handed to `submit_test_load(inputs=...)` as the CLI's `test-load --inputs` does.

Each action's result is kept in session state and the page redrawn (`st.rerun()`), so what it
says is shown beside the state it produced (a test-load started here: its verdict under the
buttons once its job ends, the full run in the Test-loads tab) (a retired engine's status RETIRED, no Confirm button
left). A button that can do nothing for this engine is disabled (a FAILED engine has nothing to
check, retire or download); Test-load is disabled, with the reason under the buttons, while no live
worker can load the engine (`service.builds.whocan.blocked_test_load`, the rule workers claim by), so
a click never leaves a job QUEUED for nobody. A test-load queued otherwise (the CLI's `--queue`, or
a worker that left since) that no live worker can run is a warning naming what is missing, with
Cancel, never a success."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.service.builds.submit import cancel_job
from enginecache.service.builds.testinputs import InputsCheck, check_engine_inputs, engine_expected_inputs
from enginecache.service.builds.testload import submit_test_load
from enginecache.service.builds.whocan import blocked_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines import records as engines
from enginecache.service.engines.detail import EngineDetail
from enginecache.service.engines.records import verify_engines
from enginecache.service.engines.views import download_name
from enginecache.service.readmodels.display import markdown_literal
from enginecache.service.readmodels.jobprogress import job_progress
from enginecache.service.readmodels.jobs import JobView
from enginecache.service.readmodels.statuses import EngineStatus, JobStatus

RESULT = "engines_result"  # st.session_state: (engine id, [(ok, line)]) of the last action
CONFIRM = "engines_retire_confirm"  # st.session_state: the engine whose retirement awaits confirmation
STARTED = "engines_testload_started"  # st.session_state: {engine id: the test-load job started here}
HAS_BLOB = (EngineStatus.READY, EngineStatus.CORRUPT, EngineStatus.UNPROVEN)


def _done(engine_id: int, lines: list[tuple[bool, str]]) -> None:
    """Keep what an action did and redraw the page from the catalog."""
    st.session_state[RESULT] = (engine_id, lines)
    data.clear_caches()
    st.rerun()


def actions(app: AppContext, engine: EngineDetail, test_loads: list[JobView], runs: list[dict[str, Any]]) -> None:
    """The action buttons and what they did; `runs` are the engine's load runs, newest first (the
    verdict of a test-load started here is shown under the buttons once its job ends)."""
    engine_id = engine.id
    status = engine.status
    cols = st.columns(5)
    if cols[0].button("Verify hash", key="engines_verify", disabled=engine.sha256 is None):
        results = data.attempt("verify failed", verify_engines, app, [engine_id])
        if results is not None:
            _done(engine_id, [(r.ok, f"engine {r.engine_id}: {r.status}, {r.message}") for r in results])
    if cols[1].button("Check compatibility", key="engines_check", disabled=status not in HAS_BLOB):
        verdicts = data.attempt("compatibility check failed", engines.engine_host_verdicts, app, engine_id)
        if verdicts is not None:
            st.session_state["engines_verdicts"] = (engine_id, verdicts)
    testable = status in (EngineStatus.READY, EngineStatus.UNPROVEN) and data.may("test_load")  # UNPROVEN: to prove it
    blocked = data.attempt("cannot read the workers", blocked_test_load, app, engine_id) if testable else None
    inputs_ready, upload = _test_load_inputs(app, engine_id) if testable else (False, None)
    clicked = cols[2].button(
        "Test-load",
        key="engines_testload",
        disabled=not (testable and inputs_ready) or blocked is not None,
        help=f"Off: {blocked}" if blocked else None,
    )
    if clicked:
        with _inputs_file(upload) as inputs:
            job = data.attempt("test-load not submitted", submit_test_load, app, engine_id, inputs=inputs)
        if job is not None:
            st.session_state.setdefault(STARTED, {})[engine_id] = job.id
            _done(engine_id, [])  # the job is shown below, from the catalog, in the state it is in
    if engine.path and status == EngineStatus.READY:
        path = engine.path

        def read_blob() -> Any:
            return open(path, "rb")

        cols[3].download_button(
            "Download",
            data=read_blob,
            file_name=download_name(engine, str(engine.model)),
            mime="application/octet-stream",
            key="engines_download",
        )
    else:
        cols[3].button("Download", key="engines_download_none", disabled=True, help="only a READY engine")
    _retire(app, engine_id, status, cols[4])
    if blocked is not None:
        st.caption(markdown_literal(f"Test-load is off: {blocked}. Start `enginecache worker` on such a host."))
    _results(engine_id)
    _test_load_jobs(test_loads)
    _started_result(engine_id, test_loads, runs)


INPUT_SOURCES = {
    "generated": "generated (the shared generator, following the model's graph)",
    "upload": "an .npz I upload",
}
INPUTS_SOURCE = "engines_testload_source"  # the radio's key
CHECKED = "engines_testload_checked"  # st.session_state: {(engine id, upload id): InputsCheck | error text}


def _test_load_inputs(app: AppContext, engine_id: int) -> tuple[bool, Any]:
    """What the next test-load feeds the engine, chosen above the buttons: (ready, the upload or
    None for generated inputs). An upload that does not fit the engine's inputs says why, and the
    Test-load button stays disabled until one does."""
    with st.expander("Test-load inputs", expanded=st.session_state.get(INPUTS_SOURCE) == "upload"):
        expected = data.attempt("cannot read the engine's inputs", engine_expected_inputs, app, engine_id)
        if expected:
            st.dataframe(
                pd.DataFrame([{"input": e.name, "dtype": e.dtype, "shape": e.shape_text} for e in expected]),
                hide_index=True,
                key="engines_testload_expected",
            )
        source = st.radio(
            "Inputs", list(INPUT_SOURCES), format_func=INPUT_SOURCES.__getitem__, horizontal=True, key=INPUTS_SOURCE
        )
        if source == "generated":
            st.caption("Each input at the profile's opt shape, made as its use in the model's graph suggests.")
            return True, None
        upload = st.file_uploader(
            "Inputs (.npz, one array per engine input, by name)", type=["npz"], key=f"engines_testload_npz_{engine_id}"
        )
        if upload is None:
            st.caption("Upload an .npz to test-load with it.")
            return False, None
        checked = _checked(app, engine_id, upload)
        if isinstance(checked, str):
            st.error(markdown_literal(checked), icon=":material/error:")
            return False, None
        fits = ", ".join(f"{c.name} {c.dtype} {list(c.shape)}" for c in checked.inputs)
        st.success(markdown_literal(f"{upload.name} fits the engine's inputs: {fits}"))
        if checked.ignored:
            st.caption(markdown_literal(f"not an input of this engine, left out: {', '.join(checked.ignored)}"))
        return True, upload


def _checked(app: AppContext, engine_id: int, upload: Any) -> InputsCheck | str:
    """The upload checked against the engine (once per upload: a live page redraws every few seconds)."""
    cache: dict[tuple[int, str], InputsCheck | str] = st.session_state.setdefault(CHECKED, {})
    key = (engine_id, str(upload.file_id))
    if key not in cache:
        with _inputs_file(upload) as path:
            try:
                cache[key] = check_engine_inputs(app, engine_id, path or Path())
            except data.EXPECTED_ERRORS as err:  # shown with its reason, and the button stays disabled
                cache[key] = f"these inputs cannot be used: {err}"
    return cache[key]


@contextmanager
def _inputs_file(upload: Any) -> Iterator[Path | None]:
    """The upload on disk under its own name (made safe) while it is checked or submitted (submit
    copies it into the store); None for generated inputs."""
    if upload is None:
        yield None
        return
    name = re.sub(r"[^A-Za-z0-9._-]", "_", Path(str(upload.name)).name) or "inputs.npz"
    with tempfile.TemporaryDirectory(prefix="enginecache-inputs-") as tmp:
        path = Path(tmp) / name
        path.write_bytes(upload.getvalue())
        yield path


def _retire(app: AppContext, engine_id: int, status: str, col: Any) -> None:
    if not data.may("retire"):
        return
    confirm = st.session_state.get(CONFIRM) == engine_id
    retirable = status in (
        EngineStatus.READY,
        EngineStatus.CORRUPT,
        EngineStatus.TAMPERED,
        EngineStatus.UNPROVEN,
        EngineStatus.PENDING,
    )
    clicked = col.button(
        "Confirm retire" if confirm and retirable else "Retire",
        key="engines_retire",
        type="primary" if confirm and retirable else "secondary",
        disabled=not retirable,
    )
    if clicked and not confirm:
        st.session_state[CONFIRM] = engine_id
        st.rerun()
    if clicked and confirm:
        st.session_state.pop(CONFIRM, None)
        if data.attempt("retire failed", engines.retire_engine, app, engine_id) is not None:
            _done(engine_id, [(True, f"engine {engine_id} retired: cache lookups no longer return it")])
    if confirm and retirable:
        st.warning(f"Retire engine {engine_id}? Click 'Confirm retire'. Its next request builds anew.")


def _results(engine_id: int) -> None:
    saved = st.session_state.get(RESULT)
    if saved and saved[0] == engine_id:
        for ok, line in saved[1]:
            (st.success if ok else st.error)(markdown_literal(line))
    verdicts = st.session_state.get("engines_verdicts")
    if verdicts and verdicts[0] == engine_id:
        _verdicts(verdicts[1])


def _verdicts(verdicts: list[Any]) -> None:
    if not verdicts:
        st.info("No worker host is known yet: start `enginecache worker` (or `enginecache serve`).")
        return
    icons = {"compatible": ":material/check_circle:", "incompatible": ":material/block:"}
    st.markdown(
        "\n".join(
            f"- {icons.get(v.verdict, ':material/help:')} **{markdown_literal(v.host)}** "
            f"({'online' if v.online else 'offline'}): **{v.verdict}**, {markdown_literal(v.reason)}"
            for v in verdicts
        )
    )


def _test_load_jobs(test_loads: list[JobView]) -> None:
    """The engine's queued and running test-loads, as they are now, each with Cancel."""
    for view in test_loads:
        job = view.job
        if not view.active:
            continue
        cols = st.columns([5, 1])
        if view.needs is not None:
            cols[0].warning(
                markdown_literal(f"Test-load job {job.id} is queued, but no live worker can run it: {view.needs}."),
                icon=":material/warning:",
            )
        elif job.status == JobStatus.RUNNING:  # as the Build view's job card shows it
            shown = job_progress(job)
            line = markdown_literal(f"test-load job {job.id} RUNNING · {shown.words} · {shown.duration}")
            if shown.fraction is not None:
                cols[0].progress(shown.fraction, text=line)
            else:
                cols[0].info(line)
        else:
            cols[0].info(f"Test-load job {job.id} is queued: a live worker that can load this engine will run it.")
        clicked = cols[1].button(
            "Cancel", key=f"engines_cancel_{job.id}", disabled=job.cancel_requested or not data.may("cancel")
        )
        if clicked:
            cancelled = data.attempt(f"cannot cancel job {job.id}", cancel_job, data.get_app(), job.id)
            if cancelled is not None:
                _done(view.engine_id or 0, [(True, f"test-load job {job.id}: {cancelled.status}")])


def _started_result(engine_id: int, test_loads: list[JobView], runs: list[dict[str, Any]]) -> None:
    """The outcome of the test-load started from this page, where it was started, once its job has
    ended: the run's verdict, reason and timings, or the job's error when it recorded no run."""
    job_id = st.session_state.get(STARTED, {}).get(engine_id)
    if job_id is None or any(v.active and v.job.id == job_id for v in test_loads):
        return  # not started here, or still queued or running (its line is shown above)
    run = next((r for r in runs if r["job_id"] == job_id), None)
    if run is None:
        failed = next((v.job for v in test_loads if v.job.id == job_id), None)
        if failed is not None:
            why = failed.error or "no reason recorded"
            st.error(markdown_literal(f"Test-load job {job_id} ended {failed.status}: {why}"), icon=":material/error:")
        return
    timings = []
    if run["load_seconds"] is not None:
        timings.append(f"load {run['load_seconds'] * 1e3:.1f} ms")
    if run["latency"]:
        timings.append(f"p50 {run['latency']['p50_ms']:.3f} ms")
    line = f"Test-load job {job_id} on {run['hostname']}: {run['verdict']}. {run['reason']}".rstrip()
    if timings:
        line += f" ({', '.join(timings)})"
    show = st.success if run["verdict"] == "PASS" else st.error
    show(markdown_literal(line) + " Accuracy, phases and latency: the Test-loads tab below.")
