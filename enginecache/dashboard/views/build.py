"""Build: a model, a matrix of targets x precisions (only the precisions this install can make for
the chosen targets' backends, `service.builds.precisionchoices`; the others named with the extra
they need), profiles (prefilled from the model's dynamic
dims, editable), calibration data for the int8/fp8 cells; submit enqueues one build job per new cell
or retry (cells already built say "cached", cells already building name their job, a cell whose
build failed before gives the reason and is a retry); below the form, the recent jobs (`buildjobs`,
from the catalog). The matrix is read from the catalog on every draw and redrawn every few seconds
while any of its cells is queued or running (`dashboard.live`)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.live import link, live_section
from enginecache.dashboard.views.buildjobs import jobs_section
from enginecache.service.builds.plan import BuildRequest, find_ready_engine, plan_build
from enginecache.service.builds.precisionchoices import precision_choices
from enginecache.service.builds.submit import plan_requirements, submit_build
from enginecache.service.builds.views import QUANTIZED, BackendChoice, backend_choices, default_profile
from enginecache.service.builds.whocan import blocked_build, live_workers
from enginecache.service.context import AppContext
from enginecache.service.readmodels.display import markdown_literal
from enginecache.service.readmodels.hosts import HostRow
from enginecache.service.readmodels.jobprogress import job_progress
from enginecache.service.readmodels.jobs import active_job_count, active_jobs_by_key, failed_builds_by_key
from enginecache.service.readmodels.models import default_precisions
from enginecache.service.readmodels.statuses import JobStatus

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
    status: str  # "cached" | "queued" | "running" | "retry" | "new" | "error"
    text: str
    cache_key: str | None = None
    engine_id: int | None = None  # the cached engine, or the FAILED one a retry follows
    job_id: int | None = None  # the active job it would join


SUBMITTABLE = ("new", "retry")


def target_options(hosts: list[HostRow]) -> list[Target]:
    """Per backend, in the registry's order: every target it builds for from any host (TensorRT-RTX's
    compute capabilities), or, for a backend that builds for the hardware it runs on, the GPUs or
    CPUs of the known workers that have it."""
    options: list[Target] = []
    for backend in backend_choices():
        known = backend.known_targets
        if known:
            options += [Target(backend.name, target, f"{backend.label} {target}") for target in known]
        else:
            options += _worker_targets(backend, hosts)
    return options


def _worker_targets(backend: BackendChoice, hosts: list[HostRow]) -> list[Target]:
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
    return pd.DataFrame(default_profile(app, model_id))


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
    """The build request of one cell: the calibration file goes to the int8/fp8 cells only, so one
    submission can mix fp32, fp16 and int8."""
    return BuildRequest(
        model=str(model_id),
        backend=target.backend,
        targets=(target.target,) if target.target else (),
        precision=precision,
        profiles=options.get("profiles", ()),
        calibration=options.get("calibration") if precision in QUANTIZED else None,
        opt_level=options.get("opt_level"),
        workspace_bytes=options.get("workspace_bytes"),
    )


def plan_cells(
    app: AppContext, model_id: int, targets: list[Target], precisions: list[str], options: dict[str, Any]
) -> list[Cell]:
    """What submitting each cell would do, from the catalog as it is now: a cached engine, an
    active job it joins, a retry of a build that failed before (with its reason), a new build, or
    an error that says why it cannot be submitted."""
    planned: list[tuple[Target, str, str | None, str]] = []
    waits: dict[str, str | None] = {}  # cache key -> why its job would wait QUEUED (no live worker can build it)
    live = live_workers(app)  # read once for every cell
    for target in targets:
        for precision in precisions:
            try:  # first: a precision this backend cannot be given here says so, not "needs calibration"
                plan = plan_build(app, make_request(model_id, target, precision, options))
            except Exception as err:  # noqa: BLE001 - the reason is shown in the cell
                planned.append((target, precision, None, str(err)))
                continue
            if precision in QUANTIZED and options.get("calibration") is None:
                planned.append((target, precision, None, f"needs calibration data (.npz) for {precision}"))
                continue
            planned.append((target, precision, plan.cache_key, ""))
            waits[plan.cache_key] = blocked_build(app, plan_requirements(plan), live=live)
    keys = [key for _, _, key, _ in planned if key]
    active = active_jobs_by_key(app, keys)
    failed = failed_builds_by_key(app, keys)
    cells = []
    for target, precision, key, error in planned:
        if key is None:
            cells.append(Cell(target, precision, "error", error))
            continue
        ready = find_ready_engine(app, key)
        if ready is not None:
            cells.append(Cell(target, precision, "cached", f"cached (engine {ready.id})", key, ready.id))
        elif key in active:
            job = active[key]
            if job.status == JobStatus.RUNNING:  # the words its job card shows
                text = f"running (job {job.id}, {job_progress(job).words})"
            else:
                text = f"queued (job {job.id})"
            state = "running" if job.status == JobStatus.RUNNING else "queued"
            cells.append(Cell(target, precision, state, text, key, job_id=job.id))
        elif key in failed:
            before = failed[key]
            text = f"retry: failed before (engine {before.engine_id}): {before.error}"
            cells.append(Cell(target, precision, "retry", text, key, before.engine_id))
        else:
            wait = waits.get(key)
            cells.append(Cell(target, precision, "new", f"new build, waits: {wait}" if wait else "new build", key))
    return cells


def submit_cells(app: AppContext, model_id: int, cells: list[Cell], options: dict[str, Any]) -> list[tuple[bool, str]]:
    """Submit every new cell and every retry; one (ok, line) per cell submitted. Cached cells,
    cells already building and cells that cannot be built are not submitted (the matrix says why)."""
    lines = []
    for cell in cells:
        if cell.status not in SUBMITTABLE:
            continue
        where = f"{cell.target.label} {cell.precision}"
        try:
            result = submit_build(app, make_request(model_id, cell.target, cell.precision, options))
        except Exception as err:  # noqa: BLE001 - reported per cell
            lines.append((False, f"{where}: rejected, {err}"))
            continue
        if result.cache_hit and result.engine is not None:
            lines.append((True, f"{where}: cached (engine {result.engine.id})"))
        elif result.job is not None:
            verb = "joined" if result.joined else "queued"
            lines.append((True, f"{where}: {verb} job {result.job.id}"))
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
    submitted = st.session_state.pop("build_submitted", None)
    if submitted:  # what the last click did, above the fold, with the jobs it made
        for ok, line in submitted:
            (st.success if ok else st.error)(markdown_literal(line))
    _new_builds(app, key)
    jobs_section()  # below the form: the page opens on what the operator came to do


def _new_builds(app: AppContext, key: data.CatalogKey) -> None:
    """The New builds form and its matrix (or what is missing before one can be drawn)."""
    st.subheader("New builds")
    sources = [r for r in data.model_rows(key) if r.parent_id is None]
    if not sources:
        st.info("No models yet: add one under Models first.")
        return
    labels = {r.id: r.label for r in sources}  # `name v2`: each version its own option
    model_id = int(st.selectbox("Model", list(labels), format_func=lambda i: labels[i], key="build_model"))

    hosts = data.worker_hosts(key)
    options_list = target_options(hosts)
    by_label = {t.label: t for t in options_list}
    default_targets = [options_list[2].label] if len(options_list) > 2 else []
    chosen_labels = st.multiselect("Targets", list(by_label), default=default_targets, key="build_targets")
    working = data.working_precisions(key, model_id)
    choices = precision_choices(sorted({by_label[label].backend for label in chosen_labels}))
    offered = [c.precision for c in choices if c.reason is None]
    precisions = st.multiselect(
        "Precisions",
        offered,
        default=[p for p in default_precisions(working) if p in offered],
        key=f"build_precisions_{model_id}",  # the default follows the model chosen
        help="Preselected: fp32, and fp16 where an fp16 engine of this model has built"
        + (f" (READY here: {', '.join(working)})" if working else ""),
    )
    withheld = [c for c in choices if c.reason is not None]
    if withheld:  # never offered, so never a "new build" whose job fails: the reason instead
        st.caption(markdown_literal("Not offered: " + "; ".join(f"{c.reason}" for c in withheld)))

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
            "Calibration data (.npz, one array per model input) for the int8/fp8 cells",
            type=["npz"],
            key="build_calibration",
        )

    targets = [by_label[label] for label in chosen_labels]
    if not targets or not precisions:
        st.info("Choose at least one target and one precision.")
        return
    building = active_job_count(app) > 0  # while anything runs, a cell may change under the operator
    live_section(_matrix_section, model_id, targets, precisions, options, calib_upload, active=building)


def _matrix_section(
    model_id: int, targets: list[Target], precisions: list[str], options: dict[str, Any], calib_upload: Any
) -> bool:
    """The matrix as the catalog has it now, its errors once, and the submit button; returns
    whether any job is still queued or running."""
    app = data.get_app()
    with calibration_file(calib_upload) as calibration:
        options = {**options, "calibration": calibration}
        cells = plan_cells(app, model_id, targets, precisions, options)
        _matrix(cells, targets, precisions)
        count = sum(c.status in SUBMITTABLE for c in cells)
        may_build = data.may("build")
        clicked = st.button(
            f"Submit {count} build(s)", type="primary", key="build_submit", disabled=count == 0 or not may_build
        )
        if not may_build:
            st.caption(BUILD_ROLE_CAPTION)
        elif count == 0:
            st.caption("Nothing to submit: every cell is cached, already building, or cannot be built as chosen.")
        if clicked and may_build and count:
            st.session_state["build_submitted"] = submit_cells(app, model_id, cells, options)
            data.clear_caches()
            st.rerun()  # the job list (above the form) and the matrix show what was just queued
    return active_job_count(app) > 0


def _matrix(cells: list[Cell], targets: list[Target], precisions: list[str]) -> None:
    grid = {(c.target.label, c.precision): c.text for c in cells}
    frame = pd.DataFrame([{"target": t.label, **{p: grid.get((t.label, p), "") for p in precisions}} for t in targets])
    st.markdown("**Matrix** (what submitting does for each cell, from the catalog now)")
    st.dataframe(frame, hide_index=True, key="build_matrix")
    links = [
        link(f"{c.target.label} {c.precision}: engine {c.engine_id}", "engines", engine=c.engine_id)
        for c in cells
        if c.engine_id is not None
    ]
    if links:
        st.caption(" · ".join(links))
    errors = [c for c in cells if c.status == "error"]
    if errors:  # once each: the submit does not repeat them
        st.error(
            "\n".join("- " + markdown_literal(f"{c.target.label} {c.precision}: {c.text}") for c in errors),
            icon=":material/error:",
        )
