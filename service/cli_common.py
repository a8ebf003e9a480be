"""What every CLI command module shares: the --json option, exit codes, the app context, output."""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import typer

from service.context import AppContext

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def app_context(ctx: typer.Context) -> AppContext:
    """The AppContext the root callback made from --home/--db."""
    obj = ctx.find_root().obj
    if not isinstance(obj, AppContext):
        raise RuntimeError("the enginecache root callback did not run")
    return obj


def emit(data: Any, as_json: bool, text: str) -> None:
    typer.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)
