"""The `enginecache` command line (Typer). Read commands print JSON with `--json`."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from core.backends.base import ProgressEvent
from core.errors import CoreError
from core.fingerprint import host_fingerprint
from db.errors import CatalogError
from service.builds import BuildRequest, build_engine
from service.context import AppContext
from service.engines import (
    check_engine,
    engine_to_dict,
    get_engine,
    list_engines,
    model_names,
    verify_engines,
)
from service.errors import BuildFailedError, ServiceError
from service.models import get_model, list_models, model_to_dict, register_model

app = typer.Typer(
    name="enginecache", help="Build TensorRT engines once, load them in milliseconds.", no_args_is_help=True
)
model_app = typer.Typer(help="Register and inspect ONNX models.", no_args_is_help=True)
engine_app = typer.Typer(help="List and inspect engines.", no_args_is_help=True)
app.add_typer(model_app, name="model")
app.add_typer(engine_app, name="engine")

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def _ctx(ctx: typer.Context) -> AppContext:
    obj = ctx.find_root().obj
    assert isinstance(obj, AppContext)
    return obj


def _emit(data: Any, as_json: bool, text: str) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        typer.echo(text)


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


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
    _emit(data, as_json, text)


@model_app.command("add")
def model_add(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="ONNX file (external data files beside it are included).")],
    name: Annotated[str | None, typer.Option(help="Name in the catalog (default: file stem).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Inspect, hash and store an ONNX model; the same bytes twice return the existing model."""
    result = register_model(_ctx(ctx), path, name=name)
    data = {**model_to_dict(result.model), "created": result.created}
    verb = "registered" if result.created else "already registered"
    _emit(data, as_json, f"{verb}: {result.model.name} (id {result.model.id}) sha256 {result.model.digest}")


@model_app.command("list")
def model_list(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Every model in the catalog, newest first."""
    models = list_models(_ctx(ctx))
    rows = [model_to_dict(m) for m in models]
    text = "\n".join(f"{m.id:>4}  {m.name:<32} {m.size_bytes:>12,d} B  {m.digest[:16]}" for m in models) or "no models"
    _emit(rows, as_json, text)


@model_app.command("show")
def model_show(
    ctx: typer.Context, model: Annotated[str, typer.Argument(help="Name, id or digest.")], as_json: JsonOption = False
) -> None:
    """Inputs/outputs with dynamic dims, opset, IR, producer, ops, parameters, files, digest."""
    record = get_model(_ctx(ctx), model)
    data = model_to_dict(record)
    _emit(data, as_json, json.dumps(data, indent=2, default=str))


def _progress_printer(enabled: bool) -> Any:
    if not enabled:
        return None

    def show(event: ProgressEvent) -> None:
        if event.kind == "start" and event.parent is None:
            typer.echo(f"  phase: {event.phase}", err=True)

    return show


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
    as_json: JsonOption = False,
) -> None:
    """Build (or find in the cache) one engine for a model, backend, target set and precision."""
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
    app_ctx = _ctx(ctx)
    result = build_engine(app_ctx, request, progress=_progress_printer(not as_json and sys.stderr.isatty()))
    data = engine_to_dict(app_ctx, result.engine, model_name=result.model.name, cache_hit=result.cache_hit)
    data["notes"] = list(result.notes)
    for note in result.notes:
        if not as_json:
            typer.echo(note, err=True)
    verb = "cache hit" if result.cache_hit else f"built in {result.engine.build_seconds:.2f} s"
    _emit(
        data,
        as_json,
        f"engine {result.engine.id}: {verb}, {result.engine.size_bytes:,d} B, "
        f"sha256 {result.engine.sha256}\n{data['path']}",
    )


@engine_app.command("list")
def engine_list(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option(help="Only this model's engines.")] = None,
    status: Annotated[str | None, typer.Option(help="Only engines in this status.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Engines in the catalog, newest first."""
    app_ctx = _ctx(ctx)
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
    _emit(rows, as_json, text)


@engine_app.command("show")
def engine_show(
    ctx: typer.Context, engine_id: Annotated[int, typer.Argument(help="Engine id.")], as_json: JsonOption = False
) -> None:
    """Everything recorded: each cache-key ingredient, fingerprint, IO, builder log."""
    app_ctx = _ctx(ctx)
    data = engine_to_dict(app_ctx, get_engine(app_ctx, engine_id), detail=True)
    _emit(data, as_json, json.dumps(data, indent=2, default=str))


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
        _fail("name engine ids or pass --all", EXIT_BAD_INPUT)
    results = verify_engines(_ctx(ctx), list(engine_ids or []))
    _emit(
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
    result = check_engine(_ctx(ctx), engine_id)
    _emit({"id": engine_id, **result.to_dict()}, as_json, f"{result.verdict}: {result.reason}")


def main() -> None:
    """Entry point: map typed errors to a message and an exit code, never a traceback."""
    try:
        code = app(standalone_mode=False)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    except BuildFailedError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(EXIT_FAILED)
    except (CoreError, CatalogError, ServiceError) as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(EXIT_BAD_INPUT)
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
