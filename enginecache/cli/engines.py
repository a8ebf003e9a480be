"""`enginecache engine list | show | retire | delete`, `verify` and `check`: the engines in the catalog."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from enginecache.cli.common import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    MODEL_REF_HELP,
    EngineIdArgument,
    JsonOption,
    LimitOption,
    OffsetOption,
    add_group,
    app_context,
    document_stream,
    emit,
    fail,
    inline,
    stream_rows,
    when,
)
from enginecache.cli.engineimport import engine_confirm_load, engine_import

# `engine list`: the columns' names, then a row per engine in the same widths (`_engine_line`).
ENGINE_HEADER = f"{'ID':>4}  {'MODEL':<24} {'VER':<4} {'BACKEND':<7} {'PREC':<5} {'TARGETS':<28} {'STATUS':<8} SHA256"


def _engine_line(r: dict[str, Any]) -> str:
    version = f"v{r['model_version']}" if r.get("model_version") else "-"
    return (
        f"{r['id']:>4}  {r['model'] or '?':<24} {version:<4} {r['backend']:<7} {r['precision']:<5} "
        f"{','.join(r['targets']):<28} {r['status']:<8} {(r['sha256'] or '')[:16]}"
    )


def engine_list(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option(
            metavar="MODEL",
            help=f"Only this model's engines: {MODEL_REF_HELP}; a NAME alone lists every version of it.",
        ),
    ] = None,
    status: Annotated[str | None, typer.Option(help="Only engines in this status.")] = None,
    limit: LimitOption = None,
    offset: OffsetOption = None,
    as_json: JsonOption = False,
) -> None:
    """Engines in the catalog, newest first; with --model, first which of its versions are shown."""
    from enginecache.service.readmodels.display import printable
    from enginecache.service.readmodels.listing import stream_engines

    listing = stream_engines(app_context(ctx), model=model, status=status, limit=limit, offset=offset or 0)
    with listing as rows:  # the model is resolved on entry: an unknown one fails before anything is written
        if rows.scope is not None and not as_json:
            typer.echo(printable(f"engines of {rows.scope.describe()}"), file=document_stream())
        stream_rows(rows, as_json, _engine_line, "no engines", header=ENGINE_HEADER)


def engine_show(ctx: typer.Context, engine_id: EngineIdArgument, as_json: JsonOption = False) -> None:
    """Everything recorded: each cache-key ingredient, fingerprint, IO, builder log."""
    from enginecache.service.readmodels.listing import show_engine

    data = show_engine(app_context(ctx), engine_id)
    emit(data, as_json, _engine_text(data))


def _engine_text(data: dict[str, Any]) -> str:
    """`engine show` for people: what the engine is, its blob, its cache key's ingredients, its IO,
    the host that built it, warnings, the error and the builder log; --json has every field. Text
    from the catalog is shown with its control characters escaped (no forged lines)."""
    from enginecache.service.engines.views import HEAD_BYTES
    from enginecache.service.readmodels.display import printable, shape_text

    version = f" v{data['model_version']}" if data.get("model_version") else ""
    model = f"model {printable(data['model'] or '?')}{version} (id {data['model_id']})"
    if data.get("variant_model_id"):
        model += f", variant model {data['variant_model_id']}"
    targets = ",".join(data.get("targets") or []) or "-"
    backend = " ".join(str(p) for p in (data["backend"], data.get("backend_version")) if p)
    lines = [
        f"engine {data['id']}: {data['status']}, {model}, {backend}, {data['precision']}, targets {printable(targets)}",
        (
            f"blob: {data.get('size_bytes') or 0:,} B, sha256 {data['sha256']}, blake3 {data.get('blake3') or '-'}"
            if data.get("sha256")
            else "blob: none"
        ),
        f"header: blake3 {data['header_blake3']} (its first {HEAD_BYTES} B, checked before the rest is read)"
        if data.get("header_blake3")
        else "",
        f"path: {printable(str(data['path']))}" if data.get("path") else "",
        f"times (UTC): created {when(data.get('created_at'))}, finished {when(data.get('finished_at'))}"
        + (f" (built in {data['build_seconds']:.2f} s)" if data.get("build_seconds") is not None else "")
        + f", verified {when(data['verified_at']) if data.get('verified_at') else 'never'}",
        f"cache key: {data.get('cache_key') or '-'}",
    ]
    for name, value in (data.get("key_ingredients") or {}).items():
        lines.append(f"  {name}: {printable(inline(value))}")
    for mode in ("input", "output"):
        tensors = [t for t in data.get("io") or [] if t.get("mode") == mode]
        if tensors:
            lines.append(f"{mode}s:")
        for tensor in tensors:
            shape = printable(shape_text(tensor.get("shape") or []))
            lines.append(f"  {printable(str(tensor.get('name')))}: {tensor.get('dtype')} {shape}")
    from enginecache.service.engines.provenance import provenance_lines

    lines.extend(printable(line) for line in provenance_lines(data.get("provenance")))
    lines.append(f"built on: {printable(_host_text(data.get('host') or {}))}")
    for gpu in (data.get("host") or {}).get("gpus") or []:
        lines.append(f"  GPU {gpu.get('index')}: {printable(str(gpu.get('name')))} {gpu.get('compute_capability')}")
    for warning in data.get("warnings") or []:
        lines.append(f"warning: {printable(str(warning))}")
    if data.get("error"):
        lines.append(f"failure: {printable(str(data['error']))}")
    log = str(data.get("builder_log") or "").rstrip("\n")
    if log:
        lines.append("builder log:")
        lines.extend(f"  {printable(line)}" for line in log.split("\n"))  # any other control escaped
    return "\n".join(line for line in lines if line)


def _host_text(host: dict[str, Any]) -> str:
    parts = [
        " ".join(str(host[k]) for k in ("os", "os_release") if host.get(k)),
        str(host.get("machine") or ""),
        str(host.get("cpu_model") or ""),
        (f"{len(host['gpus'])} GPU(s)" if host["gpus"] else "no GPU") if "gpus" in host else "",
    ]
    described = ", ".join(p for p in parts if p)
    return f"{host.get('hostname') or '?'}" + (f" ({described})" if described else "")


def verify(
    ctx: typer.Context,
    engine_ids: Annotated[
        list[int] | None, typer.Argument(help="Engine ids (default with --all: every READY or CORRUPT engine).")
    ] = None,
    all_engines: Annotated[
        bool, typer.Option("--all", help="Verify every stored model bundle (sources and variants) and every engine.")
    ] = False,
    models: Annotated[
        list[str] | None,
        typer.Option("--model", metavar="MODEL", help=f"Verify this model's stored bundle: {MODEL_REF_HELP}."),
    ] = None,
    sign: Annotated[
        bool,
        typer.Option(
            "--sign",
            help="Admin: sign each verified engine that is unsigned (or signed by another trusted key) "
            "with ENGINECACHE_SIGNING_KEY.",
        ),
    ] = False,
    remote: Annotated[
        bool,
        typer.Option(
            "--remote",
            help="Re-hash each engine's copy in the remote store (ENGINECACHE_STORE) instead, by ranged reads; "
            "a bad copy is recorded (its status stays) and the next publish of the blob replaces it.",
        ),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Re-hash stored model bundles and engine blobs; a mismatch marks it CORRUPT and exits 1.

    --remote: re-hash the engines' objects in the remote store instead (exit 1 where one is missing or
    not the blob, naming its key and the chunk); the catalog records when and what was found.

    Where trusted keys are configured (ENGINECACHE_TRUSTED_KEYS) each engine's signed statement is
    checked too: a row that no longer says what was signed is marked TAMPERED, and an unsigned one
    fails until an admin's `verify --sign`.

    --json: one array, the models' results (`"kind": "model"`) then the engines' (`"kind": "engine"`)."""
    if not engine_ids and not all_engines and not models:
        fail("name engine ids or --model, or pass --all", EXIT_BAD_INPUT)
    from enginecache.service.engines.records import verify_engines
    from enginecache.service.models.register import get_model
    from enginecache.service.models.verify import verify_models
    from enginecache.service.readmodels.display import printable

    app = app_context(ctx)
    if remote:
        from enginecache.service.engines.remoteverify import verify_remote

        checked = verify_remote(app, list(engine_ids or []))
        emit(
            [r.to_dict() for r in checked],
            as_json,
            "\n".join(f"engine {r.engine_id}: {'ok' if r.ok else 'FAILED'} - {r.message}" for r in checked)
            or "no engines",
        )
        if not all(r.ok for r in checked):
            raise typer.Exit(EXIT_FAILED)
        return
    model_results = []
    if models:
        model_results = verify_models(app, [get_model(app, ref) for ref in models])
    elif all_engines:
        model_results = verify_models(app)
    engine_results = verify_engines(app, list(engine_ids or []), sign=sign) if engine_ids or all_engines else []
    lines = [
        f"model {r.model_id} ({printable(r.name)}): {'ok' if r.ok else 'FAILED'} - {printable(r.message)}"
        for r in model_results
    ] + [f"engine {r.engine_id}: {'ok' if r.ok else 'FAILED'} - {r.message}" for r in engine_results]
    emit(
        [r.to_dict() for r in model_results] + [r.to_dict() for r in engine_results],
        as_json,
        "\n".join(lines) or "no models or engines",
    )
    if not (all(r.ok for r in model_results) and all(r.ok for r in engine_results)):
        raise typer.Exit(EXIT_FAILED)


def check(ctx: typer.Context, engine_id: EngineIdArgument, as_json: JsonOption = False) -> None:
    """Can this host load this engine? compatible | incompatible | unknown, with the reason.

    The blob is re-hashed first: one that does not match its digest is `corrupt` (exit 1), the engine
    is marked CORRUPT and its header is never handed to the backend. Where trusted keys are configured
    its signed statement is checked before that: `tampered` or `untrusted` (exit 1)."""
    from enginecache.service.engines.records import REFUSED_VERDICTS, check_engine

    result = check_engine(app_context(ctx), engine_id)
    emit({"id": engine_id, **result.to_dict()}, as_json, f"{result.verdict}: {result.reason}")
    if result.verdict in REFUSED_VERDICTS:
        raise typer.Exit(EXIT_FAILED)


def engine_retire(ctx: typer.Context, engine_id: EngineIdArgument, as_json: JsonOption = False) -> None:
    """Retire an engine (admin): no lookup returns it again; gc removes its blob after the grace period."""
    from enginecache.service.engines.records import retire_engine

    row = retire_engine(app_context(ctx), engine_id)
    emit({"id": engine_id, "status": row.status}, as_json, f"engine {engine_id} {row.status}")


def engine_delete(ctx: typer.Context, engine_id: EngineIdArgument, as_json: JsonOption = False) -> None:
    """Delete an engine (admin): retired now and its blob removed now, unless something else needs it."""
    from enginecache.service.engines.delete import delete_engine

    result = delete_engine(app_context(ctx), engine_id)
    emit(result.to_dict(), as_json, f"engine {engine_id} deleted (RETIRED, was {result.was}): {result.reason}")


def register(app: typer.Typer) -> None:
    """Add `verify`, `check` and the `engine` group to the CLI."""
    app.command()(verify)
    app.command()(check)
    add_group(
        app,
        "engine",
        "List, inspect, import, retire and delete engines.",
        {
            "list": engine_list,
            "show": engine_show,
            "import": engine_import,
            "confirm-load": engine_confirm_load,
            "retire": engine_retire,
            "delete": engine_delete,
        },
    )
