"""What every CLI command module shares: the --json option, exit codes, the app context, output."""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import typer

from enginecache.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_UNAVAILABLE
from enginecache.service.context import AppContext

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_UNAVAILABLE", "JsonOption", "app_context", "emit", "fail"]

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]


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
