"""What every CLI command module shares: the --json and paging options, exit codes, the app context,
output (one document, or rows streamed as they come; text for people, the pieces of it that several
views share), and the one style of an error message (`error_line`).

Imports nothing beyond Typer and the stdlib at module level: `enginecache --help` and each command's
`--help` load the command modules and no service code (a command imports the service functions it
calls when it runs).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TextIO

import typer

from enginecache.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_UNAVAILABLE

if TYPE_CHECKING:
    from enginecache.service.context import AppContext
    from enginecache.service.readmodels.statuses import JobProgress

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_UNAVAILABLE",
    "MODEL_REF_HELP",
    "CliSettings",
    "EngineIdArgument",
    "JobIdArgument",
    "JsonOption",
    "LimitOption",
    "OffsetOption",
    "add_group",
    "app_context",
    "document_stream",
    "emit",
    "error_document",
    "error_line",
    "fail",
    "inline",
    "job_error",
    "job_progress_printer",
    "json_stdout",
    "limit_option",
    "print_listing",
    "stream_rows",
    "when",
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
EngineIdArgument = Annotated[int, typer.Argument(help="Engine id.")]
# How every command names a model (service.readmodels.modelrefs reads it).
MODEL_REF_HELP = "NAME (its newest version), NAME@vN, NAME@ALIAS, an id or a digest (prefix)"
JobIdArgument = Annotated[int, typer.Argument(help="Job id.")]


def limit_option(default: int) -> Any:
    """The `--limit N` of a listing that has a page size of its own, newest first: the option's default
    is None all the same (see above), and the command reads `limit or default`.
    Use: `limit: Annotated[int | None, limit_option(DEFAULT_JOBS_LIMIT)] = None`."""
    return typer.Option("--limit", min=1, metavar="N", help=f"At most this many, newest first (default {default}).")


WRITE_BATCH = 500  # rows joined into one write to stdout
KIND_BY_EXIT_CODE = {EXIT_FAILED: "failed", EXIT_BAD_INPUT: "bad_input", EXIT_UNAVAILABLE: "unavailable"}
ERROR_PREFIX = "error: "  # every error message on stderr starts so (`error_line`)


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


@dataclass
class _JsonOut:
    """While a `--json` command runs: where its one document goes, and whether it has been written."""

    document: TextIO
    written: bool = False


_json_out: _JsonOut | None = None


@contextlib.contextmanager
def json_stdout(enabled: bool) -> Iterator[None]:
    """With `enabled` (the command line has --json): stdout carries the command's one JSON document
    and nothing else. Meanwhile Python's `sys.stdout` is stderr (a library's print or a logging
    handler made now), and so is file descriptor 1 (what C code and child processes write there,
    ModelOpt's and TensorRT's lines); the document goes to the real stdout, through `emit`,
    `stream_rows` or `error_document`. Everything is put back on leaving."""
    global _json_out
    if not enabled or _json_out is not None:
        yield
        return
    original = sys.stdout
    saved_fd: int | None = None
    document: TextIO = original
    try:
        out_fd, err_fd = original.fileno(), sys.stderr.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):  # not a file (a test's capture): Python level only
        out_fd = err_fd = -1
    if out_fd >= 0 and err_fd >= 0 and out_fd != err_fd:
        original.flush()
        saved_fd = os.dup(out_fd)
        os.dup2(err_fd, out_fd)
        document = open(saved_fd, "w", encoding="utf-8", closefd=False)  # noqa: SIM115 (closed below)
    _json_out = _JsonOut(document)
    sys.stdout = sys.stderr
    try:
        yield
    finally:
        _json_out = None
        sys.stdout = original
        document.flush()
        if saved_fd is not None:
            sys.stderr.flush()
            os.dup2(saved_fd, out_fd)
            document.close()
            os.close(saved_fd)


def document_stream() -> TextIO:
    """Where a command's output goes: the real stdout (see `json_stdout`)."""
    if _json_out is not None:
        _json_out.written = True
        return _json_out.document
    return sys.stdout


def error_document(message: str, kind: str, code: int) -> None:
    """With --json and nothing printed yet: the error as the command's one document,
    `{"error": message, "kind": kind, "exit_code": code}`."""
    if _json_out is None or _json_out.written:
        return
    stream = document_stream()
    stream.write(json.dumps({"error": message, "kind": kind, "exit_code": code}, indent=2) + "\n")
    stream.flush()


def emit(data: Any, as_json: bool, text: str) -> None:
    """The command's output: `data` as one JSON document with --json, else `text` for people."""
    from enginecache.service.readmodels.display import terminal_text

    typer.echo(json.dumps(data, indent=2, default=str) if as_json else terminal_text(text), file=document_stream())


def inline(value: Any) -> str:
    """A JSON value on one line, for the text views: `name fp32, profiles (input (min 1x16, max 8x16))`,
    a list of integers as a shape (`1x16`), yes/no, `-` for nothing; null and empty fields of an
    object are left out. Not made printable: the caller does (`service.readmodels.display.printable`)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_nested(v)}" for k, v in value.items() if v not in (None, "", [], {})) or "-"
    if _is_shape(value):
        return "x".join(str(v) for v in value)
    if isinstance(value, list | tuple):
        return ", ".join(_nested(v) for v in value) or "-"
    return str(value)


def _is_shape(value: Any) -> bool:
    return (
        isinstance(value, list | tuple)
        and bool(value)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    )


def _nested(value: Any) -> str:
    """`inline` of a value inside an object or a list: in parentheses where it has parts of its own."""
    text = inline(value)
    if isinstance(value, dict) or (isinstance(value, list | tuple) and len(value) > 1 and not _is_shape(value)):
        return f"({text})"
    return text


def job_error(error: str | None, engine_id: int | None) -> str:
    """A job's recorded error as the CLI says it, the engine named by its kind and id beside the
    job's own: a build job's `build 27 failed: ...` (the words of service.builds.plan.run_build, as the
    catalog keeps them) reads `engine 27 failed to build: ...`; any other error is left as it is."""
    text = error or "no error recorded"
    legacy = f"build {engine_id} failed: "
    if engine_id is not None and text.startswith(legacy):
        return f"engine {engine_id} failed to build: {text[len(legacy) :]}"
    return text


def when(iso: str | None) -> str:
    """A catalog timestamp (ISO 8601, UTC) as the text views show it: `2026-01-31 12:00:00`."""
    return iso[:19].replace("T", " ") if iso else "-"


def stream_rows(
    rows: Iterable[dict[str, Any]],
    as_json: bool,
    line: Callable[[dict[str, Any]], str],
    empty: str,
    *,
    header: str | None = None,
    out: TextIO | None = None,
) -> int:
    """Write rows as they come: with `as_json` one JSON array (an element per line, `[]` when there
    are none), else `header` (the columns' names, where given) and one `line(row)` each (`empty`
    alone when there are none). Returns the row count.

    Memory stays at one batch of rows whatever the count. Output that stops early (an error from the
    database midway) is cut short, not wrapped up: the exit status says it failed."""
    stream = out if out is not None else document_stream()
    encode = json.JSONEncoder(default=str).encode
    count = 0
    batch: list[str] = []
    for row in rows:
        if as_json:
            batch.append(("[\n" if count == 0 else ",\n") + encode(row))
        else:
            if count == 0 and header is not None:
                batch.append(header + "\n")
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


def add_group(app: typer.Typer, name: str, help: str, commands: dict[str, Callable[..., None]]) -> None:
    """Add the command group `name` to `app`: each of `commands` under its name; the group alone shows
    its help."""
    group = typer.Typer(help=help, no_args_is_help=True)
    for command, function in commands.items():
        group.command(command)(function)
    app.add_typer(group, name=name)


def print_listing(
    listing: contextlib.AbstractContextManager[Iterable[dict[str, Any]]],
    as_json: bool,
    line: Callable[[dict[str, Any]], str],
    empty: str,
    *,
    header: str | None = None,
) -> int:
    """`stream_rows` of a listing (`service.readmodels.listing.stream_*`), read within its context."""
    with listing as rows:
        return stream_rows(rows, as_json, line, empty, header=header)


def note_line(message: str) -> None:
    """A note for people on stderr (progress of a backup, a build's notes, where serve listens)."""
    from enginecache.service.readmodels.display import terminal_text

    typer.echo(terminal_text(message), err=True)


def error_line(message: str) -> None:
    """An error message on stderr, in the one style: `error: ...`, naming the object by kind and id
    (`error: job 29 FAILED: engine 27 failed to build: ...`)."""
    from enginecache.service.readmodels.display import terminal_text

    typer.echo(ERROR_PREFIX + terminal_text(message), err=True)


def fail(message: str, code: int) -> NoReturn:
    """End the command: the message on stderr (`error_line`), the error object with --json, `code`."""
    error_line(message)
    error_document(message, KIND_BY_EXIT_CODE.get(code, "failed"), code)
    raise typer.Exit(code)


def job_progress_printer(as_json: bool) -> Callable[[JobProgress], None] | None:
    """A one-line progress bar on stderr for a waiting command, when stderr is a terminal and the
    output is not JSON."""
    if as_json or not sys.stderr.isatty():
        return None
    from enginecache.service.readmodels.display import terminal_text
    from enginecache.service.readmodels.jobprogress import phase_words
    from enginecache.service.readmodels.statuses import TERMINAL_JOB_STATUSES

    def show(job: JobProgress) -> None:
        width = 30
        filled = int(job.progress * width)
        bar = "#" * filled + "-" * (width - filled)
        line = terminal_text(f"[{bar}] {job.progress:4.0%} {job.status} {phase_words(job.status, job.phase) or ''}")
        typer.echo(f"\r{line}"[:120].ljust(120), err=True, nl=False)
        if job.status in TERMINAL_JOB_STATUSES:
            typer.echo("", err=True)

    return show
