"""What every CLI command module shares: the --json and paging options, exit codes, the app context,
output (one document, or rows streamed as they come).

Imports nothing beyond Typer and the stdlib at module level: `enginecache --help` and each command's
`--help` load the command modules and no service code (a command imports the service functions it
calls when it runs).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TextIO

import typer

from enginecache.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_UNAVAILABLE

if TYPE_CHECKING:
    from enginecache.db.models import JobRecord
    from enginecache.service.context import AppContext

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_UNAVAILABLE",
    "CliSettings",
    "JsonOption",
    "LimitOption",
    "OffsetOption",
    "app_context",
    "emit",
    "fail",
    "job_progress_printer",
    "stream_rows",
]

# Options default to None (or a bool), never to another value: Typer validates every other value,
# a default too, through pydantic, whose import costs a read command about 0.1 s.
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON.")]
LimitOption = Annotated[
    int | None, typer.Option("--limit", min=1, metavar="N", help="At most this many rows (a page).")
]
OffsetOption = Annotated[
    int | None, typer.Option("--offset", min=0, metavar="N", help="Skip this many rows first (the next page).")
]

WRITE_BATCH = 500  # rows joined into one write to stdout


@dataclass
class CliSettings:
    """What the root callback was given (--home, --db); the AppContext is made from it on first use,
    so a command that needs no catalog, and every --help, imports no service code."""

    home: Path | None
    db: str | None
    app: AppContext | None = None


def app_context(ctx: typer.Context) -> AppContext:
    """The AppContext of --home/--db, made on first use and closed with the root context."""
    root = ctx.find_root()
    settings = root.obj
    if not isinstance(settings, CliSettings):
        raise RuntimeError("the enginecache root callback did not run")
    if settings.app is None:
        from enginecache.service.context import AppContext

        settings.app = AppContext.from_settings(settings.home, settings.db)
        root.call_on_close(settings.app.close)
    return settings.app


def emit(data: Any, as_json: bool, text: str) -> None:
    typer.echo(json.dumps(data, indent=2, default=str) if as_json else text)


def stream_rows(
    rows: Iterable[dict[str, Any]],
    as_json: bool,
    line: Callable[[dict[str, Any]], str],
    empty: str,
    *,
    out: TextIO | None = None,
) -> int:
    """Write rows as they come: with `as_json` one JSON array (an element per line, `[]` when there
    are none), else one `line(row)` each (`empty` when there are none). Returns the row count.

    Memory stays at one batch of rows whatever the count. Output that stops early (an error from the
    database midway) is cut short, not wrapped up: the exit status says it failed."""
    stream = out if out is not None else sys.stdout
    encode = json.JSONEncoder(default=str).encode
    count = 0
    batch: list[str] = []
    for row in rows:
        if as_json:
            batch.append(("[\n" if count == 0 else ",\n") + encode(row))
        else:
            batch.append(line(row) + "\n")
        count += 1
        if len(batch) >= WRITE_BATCH:
            stream.write("".join(batch))
            batch.clear()
    if count == 0:
        batch.append("[]\n" if as_json else empty + "\n")
    elif as_json:
        batch.append("\n]\n")
    stream.write("".join(batch))
    stream.flush()
    return count


def fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def job_progress_printer(as_json: bool) -> Callable[[JobRecord], None] | None:
    """A one-line progress bar on stderr for a waiting command, when stderr is a terminal and the
    output is not JSON."""
    if as_json or not sys.stderr.isatty():
        return None
    from enginecache.db.models import TERMINAL_JOB_STATUSES

    def show(job: JobRecord) -> None:
        width = 30
        filled = int(job.progress * width)
        bar = "#" * filled + "-" * (width - filled)
        typer.echo(f"\r[{bar}] {job.progress:4.0%} {job.status} {job.phase or ''}"[:120].ljust(120), err=True, nl=False)
        if job.status in TERMINAL_JOB_STATUSES:
            typer.echo("", err=True)

    return show
