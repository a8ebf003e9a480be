"""`enginecache engine list | show`, `verify` and `check`: the engines in the catalog."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from enginecache.cli.common import EXIT_BAD_INPUT, EXIT_FAILED, JsonOption, app_context, emit, fail
from enginecache.service.engines import (
    check_engine,
    engine_to_dict,
    get_engine,
    list_engines,
    model_names,
    verify_engines,
)


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


def engine_show(
    ctx: typer.Context, engine_id: Annotated[int, typer.Argument(help="Engine id.")], as_json: JsonOption = False
) -> None:
    """Everything recorded: each cache-key ingredient, fingerprint, IO, builder log."""
    app_ctx = app_context(ctx)
    data = engine_to_dict(app_ctx, get_engine(app_ctx, engine_id), detail=True)
    emit(data, as_json, json.dumps(data, indent=2, default=str))


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


def check(
    ctx: typer.Context, engine_id: Annotated[int, typer.Argument(help="Engine id.")], as_json: JsonOption = False
) -> None:
    """Can this host load this engine? compatible | incompatible | unknown, with the reason."""
    result = check_engine(app_context(ctx), engine_id)
    emit({"id": engine_id, **result.to_dict()}, as_json, f"{result.verdict}: {result.reason}")


def register(app: typer.Typer) -> None:
    """Add `verify`, `check` and the `engine` group to the CLI."""
    app.command()(verify)
    app.command()(check)
    group = typer.Typer(help="List and inspect engines.", no_args_is_help=True)
    group.command("list")(engine_list)
    group.command("show")(engine_show)
    app.add_typer(group, name="engine")
