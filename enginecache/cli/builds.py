"""`enginecache build`: find an engine in the cache, or build it (here, or on a worker that can)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import (
    MODEL_REF_HELP,
    JsonOption,
    app_context,
    emit,
    job_error,
    job_progress_printer,
    note_line,
)


def build(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(metavar="MODEL", help=f"{MODEL_REF_HELP}; not with --matrix.")] = None,
    backend: Annotated[str, typer.Option(help="rtx | trt | ort")] = "rtx",
    target: Annotated[
        list[str] | None, typer.Option("--target", help="Comma-separated: sm80,sm86 (rtx); cpu (ort).")
    ] = None,
    precision: Annotated[str, typer.Option(help="fp32 | fp16 | bf16 | int8 | fp8")] = "fp32",
    profile: Annotated[
        list[str] | None, typer.Option("--profile", help="INPUT=MIN,OPT,MAX with shapes like 1x3x224x224.")
    ] = None,
    calib: Annotated[Path | None, typer.Option("--calib", help="Calibration .npz for int8/fp8.")] = None,
    converter: Annotated[
        str | None, typer.Option(help="fp16 converter: modelopt | onnxconverter (default: best installed).")
    ] = None,
    opt_level: Annotated[int | None, typer.Option("--opt-level", help="Builder optimization level 0..5.")] = None,
    workspace: Annotated[int | None, typer.Option("--workspace", help="Workspace limit in bytes.")] = None,
    queue_only: Annotated[bool, typer.Option("--queue", help="Enqueue and print the job id at once.")] = False,
    matrix: Annotated[
        Path | None,
        typer.Option(
            "--matrix", metavar="FILE", help="Build every cell of a matrix file (models x targets x precisions)."
        ),
    ] = None,
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed", help="With --matrix: build again the cells whose last build of the same key FAILED."
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Build (or find in the cache) one engine; without --queue, wait and show progress.

    With --matrix FILE (a CI prebuild, docs/fleet.md): every model x target x precision the file
    names, then one summary line per cell; exit 1 when any cell failed. A cell whose last build with
    the same cache key FAILED is not built again ("failed earlier: job N, ...") unless --retry-failed."""
    if matrix is not None or model is None:
        if matrix is None:
            raise typer.BadParameter("give a MODEL (or --matrix FILE)")
        if model is not None:
            raise typer.BadParameter("give a MODEL or --matrix FILE, not both")
        _build_matrix(ctx, matrix, as_json, retry_failed=retry_failed)
        return
    if retry_failed:
        raise typer.BadParameter("--retry-failed is for --matrix FILE (a single build always builds)")
    from enginecache.errors import BuildFailedError
    from enginecache.service.builds.plan import BuildRequest
    from enginecache.service.builds.submit import submit_build, waiting_reason
    from enginecache.service.builds.submitwait import run_and_wait
    from enginecache.service.engines.records import engine_to_dict, get_engine
    from enginecache.service.readmodels.statuses import JobStatus

    request = BuildRequest(
        model=model,
        backend=backend,
        targets=tuple(target or ()),
        precision=precision,
        profiles=tuple(profile or ()),
        calibration=calib,
        converter=converter,
        opt_level=opt_level,
        workspace_bytes=workspace,
    )
    app_ctx = app_context(ctx)
    submitted = submit_build(app_ctx, request)
    if not as_json:
        for note in submitted.notes:
            note_line(note)
    if submitted.cache_hit and submitted.engine is not None:
        hit = engine_to_dict(app_ctx, submitted.engine, cache_hit=True)
        _emit_engine(hit, notes=submitted.notes, as_json=as_json)
        return
    assert submitted.job is not None
    job_id = submitted.job.id or 0
    if queue_only:
        data = submitted.to_dict()
        data["waiting"] = waiting_reason(app_ctx, submitted.job)
        verb = "joined" if submitted.joined else "queued"
        emit(data, as_json, f"job {job_id} {verb}" + (f" ({data['waiting']})" if data["waiting"] else ""))
        return
    job = run_and_wait(app_ctx, submitted.job, on_update=job_progress_printer(as_json))
    if job.status != JobStatus.SUCCEEDED or job.result_engine_id is None:
        # the job and the engine each named by kind and id: "job 29 FAILED: engine 27 failed to build: ..."
        succeeded = job.status == JobStatus.SUCCEEDED
        error = "no engine recorded" if succeeded else job_error(job.error, job.result_engine_id)
        raise BuildFailedError(f"job {job_id} {job.status}: {error}", job.result_engine_id)
    built = engine_to_dict(app_ctx, get_engine(app_ctx, job.result_engine_id), cache_hit=False)
    _emit_engine(built, notes=submitted.notes, as_json=as_json)


def _cell_line(r: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    cell = f"{r['model']:<24} {r['backend']:<4} {','.join(r['targets']) or '-':<14} {r['precision']:<5}"
    engine = f"engine {r['engine_id']}" if r["engine_id"] is not None else "no engine"
    return printable(f"{cell} {r['outcome']:<7} {engine}" + (f": {r['error']}" if r["error"] else ""))


def _build_matrix(ctx: typer.Context, path: Path, as_json: bool, *, retry_failed: bool) -> None:
    from enginecache.cli.common import EXIT_FAILED
    from enginecache.service.builds.matrix import load_matrix, run_matrix

    cells = load_matrix(path)
    results = [r.to_dict() for r in run_matrix(app_context(ctx), cells, retry_failed=retry_failed)]
    failed = sum(1 for r in results if r["outcome"] == "failed")
    earlier = sum(1 for r in results if r["failed_earlier"])
    summary = f"{len(results)} cell(s): {len(results) - failed} ready, {failed} failed"
    if earlier:
        summary += f" ({earlier} failed earlier, not built again: --retry-failed to build them)"
    data = {"cells": results, "failed": failed, "failed_earlier": earlier}
    emit(data, as_json, "\n".join([*map(_cell_line, results), summary]))
    if failed:
        raise typer.Exit(EXIT_FAILED)


def _emit_engine(data: dict[str, Any], *, notes: tuple[str, ...], as_json: bool) -> None:
    """The engine a build found or built (`engine_to_dict` with `cache_hit`), with the build's notes."""
    data["notes"] = list(notes)
    verb = "cache hit" if data["cache_hit"] else f"built in {data['build_seconds'] or 0:.2f} s"
    emit(
        data,
        as_json,
        f"engine {data['id']}: {verb}, {data['size_bytes'] or 0:,d} B, sha256 {data['sha256']}\n{data['path']}",
    )


def register(app: typer.Typer) -> None:
    """Add `build` to the CLI."""
    app.command()(build)
