"""What every CLI command module shares: the --json option, exit codes, the app context, output."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer

from enginecache.db.models import TERMINAL_JOB_STATUSES, JobRecord
from enginecache.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_UNAVAILABLE
from enginecache.service.context import AppContext

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_UNAVAILABLE",
    "JsonOption",
    "app_context",
    "emit",
    "fail",
    "job_progress_printer",
]

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


def job_progress_printer(as_json: bool) -> Callable[[JobRecord], None] | None:
    """A one-line progress bar on stderr for a waiting command, when stderr is a terminal and the
    output is not JSON."""
    if as_json or not sys.stderr.isatty():
        return None

    def show(job: JobRecord) -> None:
        width = 30
        filled = int(job.progress * width)
        bar = "#" * filled + "-" * (width - filled)
        typer.echo(f"\r[{bar}] {job.progress:4.0%} {job.status} {job.phase or ''}"[:120].ljust(120), err=True, nl=False)
        if job.status in TERMINAL_JOB_STATUSES:
            typer.echo("", err=True)

    return show
