"""The `enginecache` command line (Typer). Read commands print JSON with `--json`."""

from __future__ import annotations

import json
import logging
import sys
import threading
from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, JsonOption, app_context, emit, fail
from enginecache.core.fingerprint import host_fingerprint
from enginecache.db.models import EngineRecord, JobRecord, JobStatus
from enginecache.errors import BuildFailedError, EngineCacheError, exit_code_for
from enginecache.service.builds import BuildRequest
from enginecache.service.context import AppContext
from enginecache.service.engines import (
    check_engine,
    engine_to_dict,
    get_engine,
    list_engines,
    model_names,
    verify_engines,
)
from enginecache.service.jobs import (
    TERMINAL,
    cancel_job,
    capable_workers,
    get_job,
    job_to_dict,
    list_jobs,
    submit_build,
    wait_for_job,
    waiting_reason,
)
from enginecache.service.models import get_model, list_models, model_to_dict, register_model
from enginecache.service.worker import WorkerConfig, default_worker_name, run_worker

app = typer.Typer(
    name="enginecache", help="Build TensorRT engines once, load them in milliseconds.", no_args_is_help=True
)
model_app = typer.Typer(help="Register and inspect ONNX models.", no_args_is_help=True)
engine_app = typer.Typer(help="List and inspect engines.", no_args_is_help=True)
job_app = typer.Typer(help="Inspect and cancel jobs.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(engine_app, name="engine")
app.add_typer(job_app, name="job")


@app.callback()
def main_callback(
    ctx: typer.Context,
    home: Annotated[
        Path | None, typer.Option("--home", help="Store directory (env ENGINECACHE_HOME, default ./engines).")
    ] = None,
    db: Annotated[
        str | None, typer.Option("--db", help="Catalog URL (env ENGINECACHE_DB_URL, default SQLite in HOME).")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log at INFO.")] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    ctx.obj = AppContext.from_settings(home, db)
    ctx.call_on_close(ctx.obj.close)


@app.command()
def fingerprint(as_json: JsonOption = False) -> None:
    """This host: OS, CPU and ISA, GPUs (NVML), driver, CUDA runtime, library versions."""
    fp = host_fingerprint(probe_cuda_runtime=True)
    data = fp.to_dict()
    gpus = "\n".join(
        f"  GPU {g.index}: {g.name} {g.compute_capability.upper()} {g.memory_total_bytes // 2**20} MiB ({g.uuid})"
        for g in fp.gpus
    )
    text = "\n".join(
        [
            f"host: {fp.hostname} ({fp.os} {fp.os_release}, {fp.machine}, Python {fp.python})",
            f"cpu: {fp.cpu_model} [{fp.cpu_target}]",
            f"gpus: {len(fp.gpus)}"
            + (
                f" (driver {fp.driver_version}, CUDA {fp.cuda_driver_version})"
                if fp.gpus
                else f" - no NVIDIA GPU: NVML {fp.nvml}"
            ),
            *([gpus] if gpus else []),
            f"cuda runtime: {fp.cuda_runtime_version or 'not available'}",
            "packages: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in fp.packages.items()),
        ]
    )
    emit(data, as_json, text)


@model_app.command("add")
def model_add(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="ONNX file (external data files beside it are included).")],
    name: Annotated[str | None, typer.Option(help="Name in the catalog (default: file stem).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Inspect, hash and store an ONNX model; the same bytes twice return the existing model."""
    result = register_model(app_context(ctx), path, name=name)
    data = {**model_to_dict(result.model), "created": result.created}
    verb = "registered" if result.created else "already registered"
    emit(data, as_json, f"{verb}: {result.model.name} (id {result.model.id}) sha256 {result.model.digest}")


@model_app.command("list")
def model_list(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Every model in the catalog, newest first."""
    models = list_models(app_context(ctx))
    rows = [model_to_dict(m) for m in models]
    text = "\n".join(f"{m.id:>4}  {m.name:<32} {m.size_bytes:>12,d} B  {m.digest[:16]}" for m in models) or "no models"
    emit(rows, as_json, text)


@model_app.command("show")
def model_show(
    ctx: typer.Context, model: Annotated[str, typer.Argument(help="Name, id or digest.")], as_json: JsonOption = False
) -> None:
    """Inputs/outputs with dynamic dims, opset, IR, producer, ops, parameters, files, digest."""
    record = get_model(app_context(ctx), model)
    data = model_to_dict(record)
    emit(data, as_json, json.dumps(data, indent=2, default=str))


@app.command()
def build(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="Model name, id or digest.")],
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
    as_json: JsonOption = False,
) -> None:
    """Build (or find in the cache) one engine; without --queue, wait and show progress."""
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
            typer.echo(note, err=True)
    if submitted.cache_hit and submitted.engine is not None:
        _emit_engine(app_ctx, submitted.engine, cache_hit=True, notes=submitted.notes, as_json=as_json)
        return
    assert submitted.job is not None
    job_id = submitted.job.id or 0
    if queue_only:
        data = submitted.to_dict()
        data["waiting"] = waiting_reason(app_ctx, submitted.job)
        verb = "joined" if submitted.joined else "queued"
        emit(data, as_json, f"job {job_id} {verb}" + (f" ({data['waiting']})" if data["waiting"] else ""))
        return
    if not capable_workers(app_ctx, submitted.job):
        # No live worker can take it: run it here through the same worker code.
        config = WorkerConfig(name=f"cli-{default_worker_name()}", job_id=job_id)
        threading.Thread(
            target=run_worker, args=(app_ctx, config), kwargs={"install_signals": False}, daemon=True
        ).start()
    job = wait_for_job(app_ctx, job_id, on_update=_job_progress_printer(not as_json and sys.stderr.isatty()))
    if job.status != JobStatus.SUCCEEDED or job.result_engine_id is None:
        raise BuildFailedError(f"job {job_id} {job.status}: {job.error}", job.result_engine_id or 0)
    _emit_engine(
        app_ctx, get_engine(app_ctx, job.result_engine_id), cache_hit=False, notes=submitted.notes, as_json=as_json
    )


def _emit_engine(
    app_ctx: AppContext, engine: EngineRecord, *, cache_hit: bool, notes: tuple[str, ...], as_json: bool
) -> None:
    data = engine_to_dict(app_ctx, engine, cache_hit=cache_hit)
    data["notes"] = list(notes)
    verb = "cache hit" if cache_hit else f"built in {engine.build_seconds or 0:.2f} s"
    emit(
        data,
        as_json,
        f"engine {engine.id}: {verb}, {engine.size_bytes or 0:,d} B, sha256 {engine.sha256}\n{data['path']}",
    )


def _job_progress_printer(enabled: bool) -> Any:
    if not enabled:
        return None

    def show(job: JobRecord) -> None:
        width = 30
        filled = int(job.progress * width)
        bar = "#" * filled + "-" * (width - filled)
        typer.echo(f"\r[{bar}] {job.progress:4.0%} {job.status} {job.phase or ''}"[:120].ljust(120), err=True, nl=False)
        if job.status in TERMINAL:
            typer.echo("", err=True)

    return show


@app.command()
def worker(
    ctx: typer.Context,
    name: Annotated[str | None, typer.Option(help="Worker name (default host-pid).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Run until no job is claimable, then exit.")] = False,
    concurrency: Annotated[int, typer.Option(help="Jobs run at the same time.")] = 1,
    lease_seconds: Annotated[
        float, typer.Option("--lease-seconds", help="Lease length; heartbeat every third.")
    ] = 30.0,
    poll_seconds: Annotated[float, typer.Option("--poll-seconds", help="Idle poll interval.")] = 0.2,
) -> None:
    """Claim and run jobs this host can run, until stopped (SIGINT/SIGTERM: finish, then exit)."""
    config = WorkerConfig(
        name=name or default_worker_name(),
        once=once,
        concurrency=max(1, concurrency),
        lease_seconds=lease_seconds,
        poll_seconds=poll_seconds,
    )
    count = run_worker(app_context(ctx), config)
    typer.echo(f"worker {config.name}: ran {count} job(s)", err=True)


@app.command("jobs")
def jobs_list(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="Only jobs in this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest first.")] = 200,
    as_json: JsonOption = False,
) -> None:
    """Jobs in the queue, newest first."""
    app_ctx = app_context(ctx)
    rows = [job_to_dict(app_ctx, j) for j in list_jobs(app_ctx, status=status, limit=limit)]
    text = (
        "\n".join(
            f"{r['id']:>5}  {r['kind']:<9} {r['status']:<10} {r['progress']:>5.0%} {r['attempts']}/{r['max_attempts']} "
            f"{r['worker'] or '-':<24} {r['phase'] or r['waiting'] or ''}"
            for r in rows
        )
        or "no jobs"
    )
    emit(rows, as_json, text)


@job_app.command("show")
def job_show(
    ctx: typer.Context, job_id: Annotated[int, typer.Argument(help="Job id.")], as_json: JsonOption = False
) -> None:
    """A job's status, attempts, progress, phase, worker, requirements, error and log tail."""
    app_ctx = app_context(ctx)
    data = job_to_dict(app_ctx, get_job(app_ctx, job_id))
    emit(data, as_json, json.dumps(data, indent=2, default=str))


@job_app.command("cancel")
def job_cancel(
    ctx: typer.Context, job_id: Annotated[int, typer.Argument(help="Job id.")], as_json: JsonOption = False
) -> None:
    """Cancel a queued job (it never runs) or a running one (its process group is killed)."""
    app_ctx = app_context(ctx)
    job = cancel_job(app_ctx, job_id)
    data = job_to_dict(app_ctx, job)
    emit(data, as_json, f"job {job_id}: {job.status}" + (" (cancel requested)" if job.cancel_requested else ""))


@engine_app.command("list")
def engine_list(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Only this model's engines.")] = None,
    status: Annotated[str | None, typer.Option(help="Only engines in this status.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Engines in the catalog, newest first."""
    app_ctx = app_context(ctx)
    names = model_names(app_ctx)
    engines = list_engines(app_ctx, model=model, status=status)
    rows = [engine_to_dict(app_ctx, e, model_name=names.get(e.model_id)) for e in engines]
    text = (
        "\n".join(
            f"{r['id']:>4}  {r['model']:<24} {r['backend']:<4} {r['precision']:<5} "
            f"{','.join(r['targets']):<28} {r['status']:<8} {(r['sha256'] or '')[:16]}"
            for r in rows
        )
        or "no engines"
    )
    emit(rows, as_json, text)


@engine_app.command("show")
def engine_show(
    ctx: typer.Context, engine_id: Annotated[int, typer.Argument(help="Engine id.")], as_json: JsonOption = False
) -> None:
    """Everything recorded: each cache-key ingredient, fingerprint, IO, builder log."""
    app_ctx = app_context(ctx)
    data = engine_to_dict(app_ctx, get_engine(app_ctx, engine_id), detail=True)
    emit(data, as_json, json.dumps(data, indent=2, default=str))


@app.command()
def verify(
    ctx: typer.Context,
    engine_ids: Annotated[
        list[int] | None, typer.Argument(help="Engine ids (default with --all: every READY or CORRUPT engine).")
    ] = None,
    all_engines: Annotated[bool, typer.Option("--all", help="Verify every engine.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Re-hash engine blobs; a mismatch marks the engine CORRUPT and exits 1."""
    if not engine_ids and not all_engines:
        fail("name engine ids or pass --all", EXIT_BAD_INPUT)
    results = verify_engines(app_context(ctx), list(engine_ids or []))
    emit(
        [r.to_dict() for r in results],
        as_json,
        "\n".join(f"engine {r.engine_id}: {'ok' if r.ok else 'FAILED'} - {r.message}" for r in results) or "no engines",
    )
    if not all(r.ok for r in results):
        raise typer.Exit(EXIT_FAILED)


@app.command()
def check(
    ctx: typer.Context, engine_id: Annotated[int, typer.Argument(help="Engine id.")], as_json: JsonOption = False
) -> None:
    """Can this host load this engine? compatible | incompatible | unknown, with the reason."""
    result = check_engine(app_context(ctx), engine_id)
    emit({"id": engine_id, **result.to_dict()}, as_json, f"{result.verdict}: {result.reason}")


# Commands defined in their own modules register here (one line each).
# -- command modules --
from enginecache.cli.runtime import register as _register_runtime  # noqa: E402

_register_runtime(app)
from enginecache.cli.serve import register as _register_serve  # noqa: E402

_register_serve(app)
# -- end command modules --


def main() -> None:
    """Entry point: map typed errors to a message and an exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except EngineCacheError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(exit_code_for(err))
    except Exception as err:  # click's usage errors and aborts
        import click

        if isinstance(err, click.ClickException):
            err.show()
            sys.exit(err.exit_code)
        if isinstance(err, click.exceptions.Abort):
            sys.exit(130)
        raise
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
