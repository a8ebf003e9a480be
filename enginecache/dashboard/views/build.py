"""Build: pick a model, a matrix of targets x precisions, profiles (prefilled from the model's
dynamic dims, editable), calibration data for int8/fp8; submit enqueues one build job per cell
(cells already built say "cached"). Live progress of running jobs, their log tail, cancel."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from enginecache.core.backends.base import Backend
from enginecache.core.backends.registry import all_backends
from enginecache.core.precision.spec import PRECISIONS, QUANTIZED
from enginecache.core.profiles import resolve_profile
from enginecache.dashboard import data
from enginecache.db.models import JobStatus
from enginecache.service.builds import BuildRequest, find_ready_engine, plan_build
from enginecache.service.context import AppContext
from enginecache.service.jobs import cancel_job, submit_build
from enginecache.service.models import get_model, model_inputs
from enginecache.service.readmodels.hosts import HostRow
from enginecache.service.readmodels.jobs import JobRow, active_jobs, active_jobs_by_key, jobs_by_id
from enginecache.service.readmodels.models import default_precisions

REFRESH_SECONDS = 1.0
JOBS_SHOWN = 20


BUILD_ROLE_CAPTION = "operators and admins can build"  # shown under the disabled submit to a viewer


@dataclass(frozen=True)
class Target:
    backend: str
    target: str  # "" = the backend's default (ort: the worker's CPU)
    label: str


@dataclass(frozen=True)
class Cell:
    target: Target
    precision: str
    status: str  # "cached" | "queued" | "running" | "new" | "error"
    text: str
    cache_key: str | None = None


def target_options(hosts: list[HostRow]) -> list[Target]:
    """Per backend, in the registry's order: every target it builds for from any host (TensorRT-RTX's
    compute capabilities), or, for a backend that builds for the hardware it runs on, the GPUs or
    CPUs of the known workers that have it."""
    options: list[Target] = []
    for backend in all_backends():
        known = backend.known_targets()
        if known:
            options += [Target(backend.name, target, f"{backend.label} {target}") for target in known]
        else:
            options += _worker_targets(backend, hosts)
    return options


def _worker_targets(backend: Backend, hosts: list[HostRow]) -> list[Target]:
    """The GPUs (a GPU backend) or CPU targets of workers advertising `backend`. A CPU backend no
    worker has advertised yet is offered as "this server's CPU" (its default target)."""
    where: dict[str, str] = {}
    for host in hosts:
        caps = host.capabilities
        if backend.name not in caps.get("backends", []):
            continue
        if backend.device == "gpu":
            for gpu in caps.get("gpus", []):
                where.setdefault(str(gpu.get("compute_capability")), f"{gpu.get('name')} on {host.hostname}")
        elif caps.get("cpu_target"):
            where.setdefault(str(caps["cpu_target"]), host.hostname)
    options = [Target(backend.name, target, f"{backend.label} {target} ({on})") for target, on in sorted(where.items())]
    if not options and backend.device == "cpu":
        options.append(Target(backend.name, "", f"{backend.label} (this server's CPU)"))
    return options


def default_profile_frame(app: AppContext, model_id: int) -> pd.DataFrame:
    """One row per input: its shape with dynamic dims named, and the default min/opt/max."""
    model = get_model(app, model_id)
    inputs = model_inputs(model)
    profile = resolve_profile(inputs, {})
    shapes = {t.name: t.shape for t in inputs}
    return pd.DataFrame(
        [
            {
                "input": p.name,
                "shape": "[" + ", ".join(str(d) for d in shapes.get(p.name, ())) + "]",
                "min": "x".join(str(d) for d in p.min),
                "opt": "x".join(str(d) for d in p.opt),
                "max": "x".join(str(d) for d in p.max),
            }
            for p in profile.inputs
        ]
    )


def profile_args(edited: pd.DataFrame, defaults: pd.DataFrame) -> tuple[str, ...]:
    """`INPUT=MIN,OPT,MAX` for each row the user changed (unchanged rows keep the defaults)."""
    args = []
    base = {r["input"]: (r["min"], r["opt"], r["max"]) for r in defaults.to_dict("records")}
    for row in edited.to_dict("records"):
        values = (str(row["min"]).strip(), str(row["opt"]).strip(), str(row["max"]).strip())
        if base.get(row["input"]) != values:
            args.append(f"{row['input']}={','.join(values)}")
    return tuple(args)


def make_request(model_id: int, target: Target, precision: str, options: dict[str, Any]) -> BuildRequest:
    return BuildRequest(
        model=str(model_id),
        backend=target.backend,
        targets=(target.target,) if target.target else (),
        precision=precision,
        profiles=options.get("profiles", ()),
        calibration=options.get("calibration"),
        opt_level=options.get("opt_level"),
        workspace_bytes=options.get("workspace_bytes"),
    )


def plan_cells(
    app: AppContext, model_id: int, targets: list[Target], precisions: list[str], options: dict[str, Any]
) -> list[Cell]:
    """What submitting each cell would do: cached engine, join an active job, or a new build."""
    planned: list[tuple[Target, str, str | None, str]] = []
    for target in targets:
        for precision in precisions:
            if precision in QUANTIZED and options.get("calibration") is None:
                planned.append((target, precision, None, f"needs calibration data (.npz) for {precision}"))
                continue
            try:
                plan = plan_build(app, make_request(model_id, target, precision, options))
            except Exception as err:  # noqa: BLE001 - the reason is shown in the cell
                planned.append((target, precision, None, str(err)))
                continue
            planned.append((target, precision, plan.cache_key, ""))
    active = active_jobs_by_key(app, [key for _, _, key, _ in planned if key])
    cells = []
    for target, precision, key, error in planned:
        if key is None:
            cells.append(Cell(target, precision, "error", error))
            continue
        ready = find_ready_engine(app, key)
        if ready is not None:
            cells.append(Cell(target, precision, "cached", f"cached (engine {ready.id})", key))
        elif key in active:
            job = active[key]
            state = "running" if job.status == JobStatus.RUNNING else "queued"
            cells.append(Cell(target, precision, state, f"{state} (job {job.id})", key))
        else:
            cells.append(Cell(target, precision, "new", "new build", key))
    return cells


def submit_cells(app: AppContext, model_id: int, cells: list[Cell], options: dict[str, Any]) -> list[str]:
    """Submit every cell that is not cached; returns one line per cell and records job ids."""
    lines = []
    jobs: list[int] = list(st.session_state.get("build_job_ids", []))
    for cell in cells:
        where = f"{cell.target.label} {cell.precision}"
        if cell.status == "error":
            lines.append(f"{where}: not submitted, {cell.text}")
            continue
        try:
            result = submit_build(app, make_request(model_id, cell.target, cell.precision, options))
        except Exception as err:  # noqa: BLE001 - reported per cell
            lines.append(f"{where}: rejected, {err}")
            continue
        if result.cache_hit and result.engine is not None:
            lines.append(f"{where}: cached (engine {result.engine.id})")
        elif result.job is not None:
            verb = "joined" if result.joined else "queued"
            lines.append(f"{where}: {verb} job {result.job.id}")
            if result.job.id not in jobs:
                jobs.append(result.job.id or 0)
    st.session_state["build_job_ids"] = jobs
    return lines


@contextmanager
def calibration_file(upload: Any) -> Iterator[Path | None]:
    """The uploaded .npz on disk for as long as planning and submission need it (submit copies
    it into the store)."""
    if upload is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="enginecache-calib-") as tmp:
        path = Path(tmp) / "calibration.npz"
        path.write_bytes(upload.getvalue())
        yield path


def render() -> None:
    st.title("Build")
    app = data.get_app()
    key = data.catalog_key()
    sources = [r for r in data.model_rows(key) if r.parent_id is None]
    if not sources:
        st.info("No models yet: add one under Models first.")
        _progress_section()
        return
    labels = {r.id: f"{r.name} (id {r.id})" for r in sources}
    model_id = int(st.selectbox("Model", list(labels), format_func=lambda i: labels[i], key="build_model"))

    hosts = data.worker_hosts(key)
    options_list = target_options(hosts)
    by_label = {t.label: t for t in options_list}
    default_targets = [options_list[2].label] if len(options_list) > 2 else []
    chosen_labels = st.multiselect("Targets", list(by_label), default=default_targets, key="build_targets")
    working = data.working_precisions(key, model_id)
    precisions = st.multiselect(
        "Precisions",
        list(PRECISIONS),
        default=default_precisions(working),
        key=f"build_precisions_{model_id}",  # the default follows the model chosen
        help="Preselected: fp32, and fp16 where an fp16 engine of this model has built"
        + (f" (READY here: {', '.join(working)})" if working else ""),
    )

    defaults = data.attempt("cannot read the model's inputs", default_profile_frame, app, model_id)
    options: dict[str, Any] = {}
    if defaults is not None and not defaults.empty:
        st.markdown("**Optimization profile** (defaults from the model's dynamic dims; edit min/opt/max as `AxBxC`)")
        edited = st.data_editor(
            defaults,
            hide_index=True,
            disabled=["input", "shape"],
            key=f"build_profile_{model_id}",
        )
        options["profiles"] = profile_args(edited, defaults)
    with st.expander("Builder options"):
        level = st.selectbox("Optimization level", ["default", 0, 1, 2, 3, 4, 5], key="build_opt_level")
        options["opt_level"] = None if level == "default" else int(str(level))
        workspace_mb = st.number_input("Workspace limit (MiB, 0 = backend default)", 0, 1 << 20, 0, key="build_ws")
        options["workspace_bytes"] = int(workspace_mb) * 2**20 if workspace_mb else None

    calib_upload = None
    if any(p in QUANTIZED for p in precisions):
        calib_upload = st.file_uploader(
            "Calibration data (.npz, one array per model input) for int8/fp8", type=["npz"], key="build_calibration"
        )

    targets = [by_label[label] for label in chosen_labels]
    if not targets or not precisions:
        st.info("Choose at least one target and one precision.")
        _progress_section()
        return
    with calibration_file(calib_upload) as calibration:
        options["calibration"] = calibration
        cells = plan_cells(app, model_id, targets, precisions, options)
        _matrix(cells, targets, precisions)
        to_submit = [c for c in cells if c.status in ("new", "queued", "running")]
        label = f"Submit {sum(c.status == 'new' for c in cells)} build(s)"
        may_build = data.may("build")
        clicked = st.button(label, type="primary", key="build_submit", disabled=not to_submit or not may_build)
        if not may_build:
            st.caption(BUILD_ROLE_CAPTION)
        if clicked and may_build:
            lines = submit_cells(app, model_id, cells, options)
            data.clear_caches()
            st.session_state["build_submitted"] = lines
            st.rerun()  # the matrix and the job list show what was just queued
    for line in st.session_state.get("build_submitted", []):
        (st.error if "rejected" in line or "not submitted" in line else st.success)(line)
    _progress_section()


def _matrix(cells: list[Cell], targets: list[Target], precisions: list[str]) -> None:
    grid = {(c.target.label, c.precision): c.text for c in cells}
    frame = pd.DataFrame([{"target": t.label, **{p: grid.get((t.label, p), "") for p in precisions}} for t in targets])
    st.markdown("**Matrix** (what submitting does for each cell)")
    st.dataframe(frame, hide_index=True, key="build_matrix")
    for cell in cells:
        if cell.status == "error":
            st.error(f"{cell.target.label} {cell.precision}: {cell.text}")


def _progress_section() -> None:
    st.subheader("Jobs")
    _live_jobs()


@st.fragment(run_every=REFRESH_SECONDS)
def _live_jobs() -> None:
    app = data.get_app()
    mine = [int(i) for i in st.session_state.get("build_job_ids", [])]
    rows = {j.id: j for j in active_jobs(app, limit=JOBS_SHOWN)}
    for job in jobs_by_id(app, mine[-JOBS_SHOWN:]):
        rows.setdefault(job.id, job)
    if not rows:
        st.caption("No queued or running jobs.")
        return
    for job in sorted(rows.values(), key=lambda j: j.id, reverse=True):
        _job_card(app, job)


def _job_card(app: AppContext, job: JobRow) -> None:
    payload = job.payload
    what = " ".join(
        str(x) for x in (payload.get("backend"), payload.get("precision"), ",".join(payload.get("targets") or []))
    )
    with st.container(border=True):
        head, button = st.columns([5, 1])
        phase = job.phase or ("waiting for a worker" if job.status == JobStatus.QUEUED else "")
        value = 1.0 if job.status == JobStatus.SUCCEEDED else max(0.0, min(1.0, job.progress))
        head.progress(value, text=f"job {job.id} · model {payload.get('model')} · {what} · {job.status} · {phase}")
        if job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
            clicked = button.button(
                "Cancel", key=f"build_cancel_{job.id}", disabled=job.cancel_requested or not data.may("cancel")
            )
            if clicked and data.attempt(f"cannot cancel job {job.id}", cancel_job, app, job.id) is not None:
                data.clear_caches()
                st.rerun(scope="fragment")
        elif job.status == JobStatus.SUCCEEDED and job.result_engine_id is not None:
            button.markdown(f"engine **{job.result_engine_id}** READY")
        if job.error:
            (st.error if job.status != JobStatus.SUCCEEDED else st.caption)(f"job {job.id}: {job.error}")
        if job.log_tail:
            with st.expander("log tail"):
                st.code(job.log_tail, language=None)
