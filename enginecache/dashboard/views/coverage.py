"""Coverage: the fleet's engines as one matrix, models x GPU (or CPU) targets x precisions, each cell
READY, BUILT (built, no host of this class seen yet), INCOMPATIBLE (incompatible with every host
seen), STALE (built with an older library than the fleet runs), BUILDING, FAILED, MISSING or UNPROVEN
(an imported engine no host has loaded yet) (`service.fleet.coverage`), in colour with a legend and
always in words; a cell whose engine was imported (one file or a bundle) says so after the engine
(`READY · engine 7 · imported`), with a legend of those marks taken from
`service.engines.provenance.PROVENANCE_KINDS`, the labels `profiles` shows; one click builds every
missing and stale cell shown, through `submit_build` (which checks the role). The filters live in
the URL (`?model=1,2&backend=rtx&precision=fp16,int8`), so a link reproduces the view; the matrix
redraws itself while any job runs (`dashboard.live`).

A view of its own rather than a section of Build: Build plans one model's next builds with its
profile and builder options, while this answers a fleet-wide question (what is missing where,
across every model) that a viewer may ask too and that deserves a link of its own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from enginecache.dashboard import data
from enginecache.dashboard.live import link, live_section
from enginecache.dashboard.urlstate import from_url, to_url
from enginecache.dashboard.views.build import calibration_file
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.precisionchoices import cannot_make
from enginecache.service.builds.submit import submit_build
from enginecache.service.builds.views import PRECISIONS, QUANTIZED, backend_choices, backend_label
from enginecache.service.engines.provenance import BUILT_HERE, PROVENANCE_KINDS
from enginecache.service.fleet import coverage as cov
from enginecache.service.readmodels.display import markdown_literal
from enginecache.service.readmodels.jobs import active_job_count

DEFAULT_PRECISIONS: tuple[str, ...] = ("fp32", "fp16")
SUBMITTED = "coverage_submitted"  # st.session_state: what the last click did, [(ok, line)]
BUILD_ROLE_CAPTION = "operators and admins can build"

# (background, text) per state: a colour-blind reader has the word in every cell and the legend.
COLOURS: dict[str, tuple[str, str]] = {
    cov.READY: ("#c8e6c9", "#1b5e20"),
    cov.BUILT: ("#b2ebf2", "#006064"),
    cov.INCOMPATIBLE: ("#e1bee7", "#4a148c"),
    cov.STALE: ("#ffe0b2", "#8a4b00"),
    cov.BUILDING: ("#bbdefb", "#0d47a1"),
    cov.FAILED: ("#ffcdd2", "#b71c1c"),
    cov.MISSING: ("#eeeeee", "#424242"),
    cov.UNPROVEN: ("#fff9c4", "#5d4c00"),
}
LEGEND: dict[str, str] = {  # state -> what it means
    cov.READY: "built with the fleet's library version, loads on a known host",
    cov.BUILT: f"{cov.NO_HOST_OF_CLASS}: nothing has tried to load it (built ahead of time, e.g. on a CPU host)",
    cov.INCOMPATIBLE: f"{cov.REFUSED_BY_EVERY_HOST}: hosts of its class are known, and each refuses it",
    cov.STALE: "built with an older library version than the fleet runs: rebuild it",
    cov.BUILDING: "a build job is queued or running",
    cov.FAILED: "the last build failed (why: below the matrix)",
    cov.MISSING: "no engine, or only retired ones",
    cov.UNPROVEN: "an imported engine no host has loaded yet: lookups pass it by until a test-load proves it",
}
EVERY_TARGET = "all"  # ?targets=all: every target each backend builds for, not only those in use


def _list_param(allowed: Sequence[Any], parse: Callable[[str], Any] = str) -> Callable[[str], list[Any] | None]:
    """A URL value `a,b` as the allowed values it names (in the widget's order); None if none."""

    def read(text: str) -> list[Any] | None:
        asked = set()
        for part in text.split(","):
            part = part.strip()
            if part:
                try:
                    asked.add(parse(part))
                except ValueError:
                    continue
        chosen = [value for value in allowed if value in asked]
        return chosen or None

    return read


def _multi(
    label: str,
    options: Sequence[Any],
    key: str,
    param: str,
    default: Sequence[Any] = (),
    fmt: Callable[[Any], str] = str,
    parse: Callable[[str], Any] = str,
    placeholder: str = "",
) -> list[Any]:
    """A multiselect kept in the URL as `param=a,b` (the default leaves the URL)."""
    from_url(key, param, _list_param(options, parse))
    if key not in st.session_state:
        st.session_state[key] = [v for v in default if v in options]
    chosen = st.multiselect(label, list(options), key=key, format_func=fmt, placeholder=placeholder)
    to_url(param, None if list(chosen) == [v for v in default if v in options] else ",".join(str(v) for v in chosen))
    return list(chosen)


def render() -> None:
    st.title("Coverage")
    key = data.catalog_key()
    sources = [r for r in data.model_rows(key) if r.parent_id is None]
    if not sources:
        st.info("No models yet: add one under Models, then build it; this matrix shows where its engines are.")
        return
    names = {r.id: r.name for r in sources}
    backends = {b.name: b.label for b in backend_choices()}
    cols = st.columns([3, 2, 2])
    with cols[0]:
        model_ids = _multi(
            "Models", sorted(names, key=lambda i: (names[i], i)), "coverage_models", "model",
            fmt=names.__getitem__, parse=int, placeholder="every model",
        )  # fmt: skip
    with cols[1]:
        chosen_backends = _multi(
            "Backends",
            list(backends),
            "coverage_backends",
            "backend",
            fmt=backends.__getitem__,
            placeholder="every backend",
        )
    with cols[2]:
        precisions = _multi("Precisions", PRECISIONS, "coverage_precisions", "precision", default=DEFAULT_PRECISIONS)
    from_url("coverage_every", "targets", lambda text: text == EVERY_TARGET or None)
    every = st.toggle(
        "Every target a backend builds for",
        key="coverage_every",
        help="Off: the targets in use (a known host has it, or an engine or a build is for it)",
    )
    to_url("targets", EVERY_TARGET if every else None)
    if not precisions:
        st.info("Choose at least one precision.")
        return
    submitted = st.session_state.pop(SUBMITTED, None)
    if submitted:
        for ok, line in submitted:
            (st.success if ok else st.error)(markdown_literal(line))
    args = (tuple(model_ids) or None, tuple(chosen_backends) or None, tuple(precisions), every)
    live_section(_matrix_section, *args, active=active_job_count(data.get_app()) > 0)


def _legend() -> None:
    """Each state in its colour and in words, with what it means (the cells use the same colours)."""
    legend = pd.DataFrame([{"state": state, "means": meaning} for state, meaning in LEGEND.items()])
    st.dataframe(legend.style.map(_style, subset=["state"]), hide_index=True, key="coverage_legend")
    marks = pd.DataFrame(
        [
            {"mark": f"STATE · engine N{cov.MARK_SEPARATOR}{kind}", "means": meaning}
            for kind, meaning in PROVENANCE_KINDS.items()
            if kind != BUILT_HERE
        ]
    )
    st.dataframe(marks, hide_index=True, key="coverage_marks")
    st.caption(f"A cell with no mark names an engine {BUILT_HERE} ({PROVENANCE_KINDS[BUILT_HERE]}).")


def _matrix_section(
    model_ids: tuple[int, ...] | None,
    backends: tuple[str, ...] | None,
    precisions: tuple[str, ...],
    every_target: bool,
) -> bool:
    """The matrix as the catalog has it now, what its cells need, and the build button; returns
    whether any job is still queued or running."""
    app = data.get_app()  # read on every draw, not cached: a live section shows the catalog as it is
    matrix = cov.coverage(app, model_ids=model_ids, backends=backends, precisions=precisions, every_target=every_target)
    counts = matrix.counts()
    versions = ", ".join(f"{backend_label(b)} {v}" for b, v in sorted(matrix.fleet_versions.items()))
    st.caption(
        " · ".join(f"{state} {counts[state]}" for state in cov.STATES)
        + f" · {matrix.host_count} known host(s)"
        + (f" · the fleet's newest libraries: {versions}" if versions else " · no worker has reported its libraries")
    )
    if not matrix.columns:
        st.info("No target in use for these backends: turn on 'Every target a backend builds for'.")
        return active_job_count(app) > 0
    frame = pd.DataFrame(
        [
            {
                "model": name,
                "precision": precision,
                **{
                    column.label: cell.text if (cell := matrix.cell(model_id, precision, column)) else ""
                    for column in matrix.columns
                },
            }
            for model_id, name in matrix.models
            for precision in matrix.precisions
        ]
    )
    st.dataframe(frame.style.map(_style), hide_index=True, key="coverage_matrix")
    _legend()
    _details(matrix)
    _build_button(matrix)
    return active_job_count(app) > 0


def _style(text: Any) -> str:
    state = str(text).split(" ", 1)[0]
    if state not in COLOURS:
        return ""
    background, ink = COLOURS[state]
    return f"background-color: {background}; color: {ink}"


def _details(matrix: cov.Coverage) -> None:
    """Why each cell that is not READY or MISSING is what it is, with a link to its engine."""
    names = dict(matrix.models)
    explained = (cov.FAILED, cov.INCOMPATIBLE, cov.STALE, cov.BUILT, cov.UNPROVEN)
    shown = [c for c in matrix.cells if c.state in explained or c.job_id is not None]
    if not shown:
        return
    title = f"Why: {len(shown)} cell(s) failed, stale, incompatible, built for no known host, unproven or building"
    with st.expander(title, expanded=False):
        lines = []
        for c in shown:
            where = f"{names.get(c.model_id, c.model_id)} {c.precision} {c.column.label}: {c.state}"
            if c.provenance and c.provenance != BUILT_HERE:
                where += f" ({c.provenance})"
            engine = f" ({link(f'engine {c.engine_id}', 'engines', engine=c.engine_id)})" if c.engine_id else ""
            reason = f", {markdown_literal(c.reason)}" if c.reason else ""
            lines.append(f"- {markdown_literal(where)}{engine}{reason}")
        st.markdown("\n".join(lines))


@dataclass(frozen=True)
class Buildable:
    """What "Build missing or stale" would do: the cells it submits, the int8/fp8 cells it leaves out
    for want of calibration data, and those this install cannot make (cell, why: the extra to install)."""

    cells: list[cov.Cell]
    need_calibration: list[cov.Cell]
    cannot_make: list[tuple[cov.Cell, str]]


def buildable_cells(matrix: cov.Coverage, calibration: bool) -> Buildable:
    """The missing and stale cells a click submits, and those it leaves out (`Buildable`)."""
    wanted = [c for c in matrix.cells if c.state in cov.BUILDABLE]
    unable = [(c, why) for c in wanted if (why := cannot_make(c.precision, c.column.backend)) is not None]
    left = [c for c in wanted if c not in {cell for cell, _why in unable}]
    needs = [c for c in left if c.precision in QUANTIZED and not calibration]
    return Buildable([c for c in left if c not in needs], needs, unable)


def submit_cells(cells: Sequence[cov.Cell], names: dict[int, str], calibration: Path | None) -> list[tuple[bool, str]]:
    """Submit one build per cell (default profile and builder options); one (ok, line) per cell."""
    app = data.get_app()
    lines = []
    for cell in cells:
        where = f"{names.get(cell.model_id, cell.model_id)} {cell.precision} {cell.column.label}"
        request = BuildRequest(
            model=str(cell.model_id),
            backend=cell.column.backend,
            targets=(cell.column.target,),
            precision=cell.precision,
            calibration=calibration if cell.precision in QUANTIZED else None,
        )
        try:
            result = submit_build(app, request)
        except Exception as err:  # noqa: BLE001 - reported per cell, with its reason
            lines.append((False, f"{where}: rejected, {err}"))
            continue
        if result.cache_hit and result.engine is not None:
            lines.append((True, f"{where}: cached (engine {result.engine.id})"))
        elif result.job is not None:
            lines.append((True, f"{where}: {'joined' if result.joined else 'queued'} job {result.job.id}"))
    return lines


def _build_button(matrix: cov.Coverage) -> None:
    calibration_upload = None
    if any(c.precision in QUANTIZED for c in buildable_cells(matrix, calibration=True).cells):
        calibration_upload = st.file_uploader(
            "Calibration data (.npz, one array per model input) for the missing or stale int8/fp8 cells",
            type=["npz"],
            key="coverage_calibration",
        )
    plan = buildable_cells(matrix, calibration_upload is not None)
    cells, skipped = plan.cells, plan.need_calibration
    may_build = data.may("build")
    clicked = st.button(
        f"Build {len(cells)} missing or stale cell(s)",
        type="primary",
        key="coverage_build",
        disabled=not cells or not may_build,
        help="One build per cell, with the model's default profile and builder options (Build has the rest)",
    )
    if plan.cannot_make:
        cell, why = plan.cannot_make[0]
        st.caption(
            f"{len(plan.cannot_make)} missing cell(s) are left out: this install cannot make them "
            f"({cell.precision} for {cell.column.label}: {why})."
        )
    if not may_build:
        st.caption(BUILD_ROLE_CAPTION)
    elif skipped:
        st.caption(f"{len(skipped)} int8/fp8 cell(s) need calibration data: upload an .npz to include them.")
    elif not cells:
        st.caption("Nothing to build: every cell shown is READY, building, failed or has no host to load it.")
    if clicked and may_build and cells:
        with calibration_file(calibration_upload) as calibration:
            st.session_state[SUBMITTED] = submit_cells(cells, dict(matrix.models), calibration)
        data.clear_caches()
        st.rerun()
