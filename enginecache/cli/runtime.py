"""`enginecache test-load`, `ready` and `export`: the serving side of an engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    MODEL_REF_HELP,
    EngineIdArgument,
    JsonOption,
    app_context,
    emit,
    fail,
    job_progress_printer,
)
from enginecache.errors import JobWaitError
from enginecache.service.builds.submit import waiting_reason
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.builds.testload import TestLoadOptions, run_test_load, submit_test_load
from enginecache.service.engines.loadruns import list_load_runs, load_run_to_dict
from enginecache.service.fleet.exports import export_model
from enginecache.service.readmodels.statuses import JobStatus
from enginecache.service.serving.readiness import check_ready
from enginecache.service.serving.runtimetypes import RuntimeSpec
from enginecache.service.serving.servestate import check_state


def describe_run(run: dict[str, Any]) -> str:
    """A load run as text: verdict, phases, latency, accuracy per output."""
    lines = [
        f"engine {run['engine_id']} on {run['hostname']} ({run['host_target']}): {run['verdict']} - {run['reason']}"
    ]
    if run["phases"]:
        lines.append("phases: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in run["phases"].items()))
    latency = run["latency"]
    if latency:
        lines.append(
            f"latency ({latency['iterations']} iterations, batch {latency['batch']}): p50 {latency['p50_ms']:.3f} ms, "
            f"p90 {latency['p90_ms']:.3f} ms, p99 {latency['p99_ms']:.3f} ms, mean {latency['mean_ms']:.3f} ms, "
            f"{latency['throughput']:.1f} samples/s"
        )
    for out in run["accuracy"]:
        lines.append(
            f"  {out['name']}: max abs {out['max_abs']:.3g}, max rel {out['max_rel']:.3g}, "
            f"cosine {out['cosine']:.6f} {'ok' if out['passed'] else 'FAIL'}"
        )
    if run["tolerances"]:
        lines.append("tolerances: " + ", ".join(f"{k} {v:g}" for k, v in run["tolerances"].items()))
    return "\n".join(lines)


def _tolerances(atol: float | None, rtol: float | None, min_cosine: float | None) -> dict[str, float]:
    given = {"atol": atol, "rtol": rtol, "min_cosine": min_cosine}
    return {k: v for k, v in given.items() if v is not None}


def testload_command(
    ctx: typer.Context,
    engine_id: EngineIdArgument,
    iterations: Annotated[int, typer.Option(help="Timed iterations after the first inference.")] = 50,
    batch: Annotated[int | None, typer.Option(help="Batch size (default: the profile's opt shape).")] = None,
    inputs: Annotated[Path | None, typer.Option("--inputs", help=".npz of inputs by name (default: random).")] = None,
    atol: Annotated[float | None, typer.Option(help="Override the precision's absolute tolerance.")] = None,
    rtol: Annotated[float | None, typer.Option(help="Override the relative tolerance.")] = None,
    min_cosine: Annotated[float | None, typer.Option("--min-cosine", help="Override the cosine minimum.")] = None,
    here: Annotated[
        bool, typer.Option("--here", help="Run on this host now, whatever the routing (records its verdict).")
    ] = False,
    queue_only: Annotated[bool, typer.Option("--queue", help="Enqueue and print the job id at once.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Load an engine, time each phase and N iterations, compare outputs with ONNX Runtime on the fp32 ONNX.

    Exit 0 on PASS; 1 on FAIL, INCOMPATIBLE, CORRUPT or ERROR, or when no worker can load the engine.
    """
    app_ctx = app_context(ctx)
    tolerances = _tolerances(atol, rtol, min_cosine)
    options = TestLoadOptions(iterations=iterations, batch=batch, inputs=inputs, tolerances=tolerances or None)
    if here:
        _finish_run(load_run_to_dict(run_test_load(app_ctx, engine_id, options)), as_json)
        return
    job = submit_test_load(app_ctx, engine_id, options)
    job_id = job.id or 0
    if queue_only:
        waiting = waiting_reason(app_ctx, job)
        emit(
            {"job_id": job_id, "status": job.status, "waiting": waiting},
            as_json,
            f"test-load job {job_id} {job.status}" + (f" ({waiting})" if waiting else ""),
        )
        return
    try:
        done = run_and_wait(app_ctx, job, on_update=job_progress_printer(as_json))
    except JobWaitError as err:
        if err.timed_out:
            raise
        fail(
            f"{err}; pass --here to record this host's verdict, or --queue to leave the job for such a worker",
            err.exit_code,
        )
    if done.status != JobStatus.SUCCEEDED:
        fail(f"test-load job {job_id} {done.status}: {done.error}", EXIT_FAILED)
    runs = [r for r in list_load_runs(app_ctx, engine_id) if r["job_id"] == job_id]
    if not runs:
        fail(f"test-load job {job_id} succeeded but recorded no load run", EXIT_FAILED)
    _finish_run(runs[0], as_json)


def _finish_run(run: dict[str, Any], as_json: bool) -> None:
    emit(run, as_json, describe_run(run))
    if run["verdict"] != "PASS":
        raise typer.Exit(EXIT_FAILED)


def _spec(
    backend: str, precision: str, target: list[str] | None, profile: list[str] | None, calib: Path | None
) -> RuntimeSpec:
    return RuntimeSpec(
        backend=backend,
        precision=precision,
        targets=tuple(target or ()),
        profiles=tuple(profile or ()),
        calibration=calib,
    )


def ready_command(
    ctx: typer.Context,
    model: Annotated[
        str | None, typer.Option("--model", metavar="MODEL", help=f"{MODEL_REF_HELP} (the catalog check).")
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option("--state", help="A serving process's state file (load_or_build state_file=): the cheap probe."),
    ] = None,
    backend: Annotated[str, typer.Option(help="rtx | trt | ort")] = "rtx",
    precision: Annotated[str, typer.Option(help="fp32 | fp16 | bf16 | int8 | fp8")] = "fp32",
    target: Annotated[list[str] | None, typer.Option("--target", help="As for build.")] = None,
    profile: Annotated[list[str] | None, typer.Option("--profile", help="As for build.")] = None,
    calib: Annotated[Path | None, typer.Option("--calib", help="As for build (int8/fp8).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Readiness probe: exit 0 when ready, else say why and exit 1.

    --state FILE: the serving process that wrote FILE (load_or_build with state_file=) is alive and
    still holds the engine it verified at load (same boot, same process, blob unchanged); nothing
    is re-hashed or opened, for a probe run every few seconds. --model M: this host's engine for M is
    in the catalog, verified (its blob re-hashed) and compatible, for a startup probe.
    """
    if (model is None) == (state is None):
        fail("give --model (the catalog check) or --state (a serving process's state file)", EXIT_BAD_INPUT)
    if state is not None:
        probed = check_state(state)
        emit(probed.to_dict(), as_json, ("ready: " if probed.ready else "not ready: ") + probed.reason)
        if not probed.ready:
            raise typer.Exit(EXIT_FAILED)
        return
    assert model is not None
    result = check_ready(app_context(ctx), model, _spec(backend, precision, target, profile, calib))
    emit(result.to_dict(), as_json, ("ready: " if result.ready else "not ready: ") + result.reason)
    if not result.ready:
        raise typer.Exit(EXIT_FAILED)


def export_command(
    ctx: typer.Context,
    dest: Annotated[Path, typer.Argument(help="Destination directory.")],
    model: Annotated[str, typer.Option("--model", metavar="MODEL", help=f"{MODEL_REF_HELP}.")],
    fmt: Annotated[str, typer.Option("--format", help="triton | tree")] = "tree",
    backend: Annotated[str | None, typer.Option(help="Only this backend's engines.")] = None,
    precision: Annotated[str | None, typer.Option(help="Only this precision (triton: default fp32).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Write a Triton model repository or the per-hardware tree with a manifest of fingerprints and sha256."""
    result = export_model(app_context(ctx), model, dest, fmt=fmt, backend=backend, precision=precision)
    emit(
        result.to_dict(),
        as_json,
        "\n".join(
            [
                f"exported {len(result.files)} file(s) to {result.root}",
                *[str(p) for p in result.files],
                *[f"warning: {w}" for w in result.warnings],
            ]
        ),
    )


def register(app: typer.Typer) -> None:
    """Add `test-load`, `ready` and `export` to the CLI."""
    app.command("test-load")(testload_command)
    app.command("ready")(ready_command)
    app.command("export")(export_command)


__all__ = ["describe_run", "register"]
