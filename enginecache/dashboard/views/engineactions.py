"""An engine's actions on the Engines view: Verify hash, Check compatibility, Test-load,
Download, Retire (with a confirmation); the engine's test-load jobs from the catalog.

Each action's result is kept in session state and the page redrawn (`st.rerun()`), so what it
says is shown beside the state it produced (a retired engine's status RETIRED, no Confirm button
left). A button that can do nothing for this engine is disabled (a FAILED engine has nothing to
check, retire or download). A test-load no live worker can run is a warning naming what is
missing, with Cancel, never a success."""

from __future__ import annotations

from typing import Any

import streamlit as st

from enginecache.core.backends.registry import get_backend
from enginecache.core.plaintext import markdown_literal
from enginecache.dashboard import data
from enginecache.db.models import EngineRecord, EngineStatus, JobStatus
from enginecache.service import engines
from enginecache.service.context import AppContext
from enginecache.service.engines import verify_engines
from enginecache.service.jobs import cancel_job
from enginecache.service.readmodels.jobs import JobView
from enginecache.service.testload import submit_test_load

RESULT = "engines_result"  # st.session_state: (engine id, [(ok, line)]) of the last action
CONFIRM = "engines_retire_confirm"  # st.session_state: the engine whose retirement awaits confirmation
HAS_BLOB = (EngineStatus.READY, EngineStatus.CORRUPT)


def download_name(engine: EngineRecord, model: str) -> str:
    """`convnet.fp32.sm86.plan`, `convnet.fp32.x86_64-avx2.ort`: the suffix is the backend's own."""
    suffix = get_backend(engine.backend).triton.file_suffix
    targets = engine.targets.replace(",", "-") or "any"
    return f"{model}.{engine.precision}.{targets}{suffix}"


def _done(engine_id: int, lines: list[tuple[bool, str]]) -> None:
    """Keep what an action did and redraw the page from the catalog."""
    st.session_state[RESULT] = (engine_id, lines)
    data.clear_caches()
    st.rerun()


def actions(app: AppContext, engine: EngineRecord, info: dict[str, Any], test_loads: list[JobView]) -> None:
    engine_id = engine.id or 0
    status = engine.status
    cols = st.columns(5)
    if cols[0].button("Verify hash", key="engines_verify", disabled=info["sha256"] is None):
        results = data.attempt("verify failed", verify_engines, app, [engine_id])
        if results is not None:
            _done(engine_id, [(r.ok, f"engine {r.engine_id}: {r.status}, {r.message}") for r in results])
    if cols[1].button("Check compatibility", key="engines_check", disabled=status not in HAS_BLOB):
        verdicts = data.attempt("compatibility check failed", engines.engine_host_verdicts, app, engine_id)
        if verdicts is not None:
            st.session_state["engines_verdicts"] = (engine_id, verdicts)
    testable = status == EngineStatus.READY and data.may("test_load")
    if cols[2].button("Test-load", key="engines_testload", disabled=not testable):
        job = data.attempt("test-load not submitted", submit_test_load, app, engine_id)
        if job is not None:
            _done(engine_id, [])  # the job is shown below, from the catalog, in the state it is in
    if info["path"] and status == EngineStatus.READY:
        path = info["path"]

        def read_blob() -> Any:
            return open(path, "rb")

        cols[3].download_button(
            "Download",
            data=read_blob,
            file_name=download_name(engine, str(info["model"])),
            mime="application/octet-stream",
            key="engines_download",
        )
    else:
        cols[3].button("Download", key="engines_download_none", disabled=True, help="only a READY engine")
    _retire(app, engine_id, status, cols[4])
    _results(engine_id)
    _test_load_jobs(test_loads)


def _retire(app: AppContext, engine_id: int, status: str, col: Any) -> None:
    if not data.may("retire"):
        return
    confirm = st.session_state.get(CONFIRM) == engine_id
    retirable = status in (EngineStatus.READY, EngineStatus.CORRUPT, EngineStatus.PENDING)
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
        elif job.status == JobStatus.RUNNING:
            phase = f" · {job.phase}" if job.phase else ""
            cols[0].progress(
                max(0.0, min(1.0, job.progress)), text=markdown_literal(f"test-load job {job.id} RUNNING{phase}")
            )
        else:
            cols[0].info(f"Test-load job {job.id} is queued: a live worker that can load this engine will run it.")
        clicked = cols[1].button(
            "Cancel", key=f"engines_cancel_{job.id}", disabled=job.cancel_requested or not data.may("cancel")
        )
        if clicked:
            cancelled = data.attempt(f"cannot cancel job {job.id}", cancel_job, data.get_app(), job.id)
            if cancelled is not None:
                _done(view.engine_id or 0, [(True, f"test-load job {job.id}: {cancelled.status}")])
