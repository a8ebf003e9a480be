"""The `enginecache` command line (Typer): the root app, its options, and the entry point.

Each command module registers its commands through `register(app)`; none imports this module.
The root makes each of them a `Command` (each group a `Group`): `--help` shows a boolean flag as a
flag, with no value. A command prints text for people, or with `--json` exactly one JSON document
on stdout (on failure the error object). An error is one message on stderr, `error: ...`
(`cli.common.error_line`), a usage error too, its usage after it. Exit codes: 0 ok, 1 failed or
corrupt, 2 bad input, 3 the catalog or the store is unavailable (see enginecache.errors).

The root group is lazy: a command module is imported when one of its commands runs or shows its
own `--help`, and `enginecache --help` lists the commands from `COMMANDS`, grouped in the panels of
`PANELS` (models, engines and builds, serving and fleet, maintenance, access), without importing any of
them (tests/test_cli_listing.py checks that the list reads exactly as the modules' own help). So a
command pays for its own imports only, and the root callback opens nothing: the app context (and
the catalog) is made when a command first asks for it (`cli.common.app_context`).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

from enginecache.cli.common import KIND_BY_EXIT_CODE, CliSettings, error_document, error_line, json_stdout
from enginecache.errors import EXIT_FAILED, EngineCacheError, exit_code_for

EXIT_INTERRUPTED = 130

# Every command of the root group, in the order `--help` lists them: the module under
# enginecache.cli that registers it, and the first paragraph of its help.
COMMANDS: dict[str, tuple[str, str]] = {
    "fingerprint": ("host", "This host: OS, CPU and ISA, GPUs (NVML), driver, CUDA runtime, library versions."),
    "verify": ("engines", "Re-hash stored model bundles and engine blobs; a mismatch marks it CORRUPT and exits 1."),
    "check": ("engines", "Can this host load this engine? compatible | incompatible | unknown, with the reason."),
    "build": ("builds", "Build (or find in the cache) one engine; without --queue, wait and show progress."),
    "worker": ("jobs", "Claim and run jobs this host can run, until stopped (SIGINT/SIGTERM: finish, then exit)."),
    "jobs": ("jobs", "Jobs in the queue, newest first."),
    "test-load": (
        "runtime",
        "Load an engine, time each phase and N iterations, compare outputs with ONNX Runtime on the fp32 ONNX.",
    ),
    "ready": ("runtime", "Readiness probe: exit 0 when ready, else say why and exit 1."),
    "export": (
        "runtime",
        "Write a Triton model repository or the per-hardware tree with a manifest of fingerprints and sha256.",
    ),
    "profiles": (
        "fleetcmd",
        "Every engine of the model, compatible with this host or not and why; * marks the one pull takes.",
    ),
    "pull": (
        "fleetcmd",
        "Copy the engine that fits this host into DIR, verified, with a manifest; resumable and idempotent.",
    ),
    "serve": ("serve", "Start the dashboard and one local worker on this catalog; ^C stops both."),
    "backup": (
        "backupcmd",
        "Back up the catalog and every blob it references into DEST, online; a manifest lists each digest.",
    ),
    "restore": (
        "backupcmd",
        "Restore a backup into an empty home and catalog, verified against its manifest, migrated to head.",
    ),
    "audit": ("auditcmd", "The audit log: every change, who made it, when and from where; newest first."),
    "release": ("releasecmd", "Versions and aliases of a model: promote, roll back, list."),
    "role": ("rolescmd", "Give dashboard users roles (viewer < operator < admin); deny by default."),
    "keys": ("keyscmd", "Ed25519 keys that sign engines (a build pool's) and that hosts trust."),
    "runtime-cache": ("runtimecachecmd", "TensorRT-RTX runtime caches written back by serving hosts: publish, list."),
    "model": ("models", "Register and inspect ONNX models."),
    "engine": ("engines", "List, inspect, import, retire and delete engines."),
    "job": ("jobs", "Inspect and cancel jobs."),
    "gc": (
        "maintenance",
        "Remove unreferenced blobs, retired ones past the grace and stale temp folders (a dry run without --apply).",
    ),
}

# How `enginecache --help` groups the commands: panel title -> its commands, in the order shown (a
# first-time user's two commands first: `model add`, then `build`). A command in no panel is listed
# last, under OTHER_PANEL.
PANELS: dict[str, tuple[str, ...]] = {
    "Models": ("model", "release"),
    "Engines and builds": ("build", "engine", "check", "test-load", "jobs", "job", "worker"),
    "Serving and fleet": ("profiles", "pull", "ready", "export", "fingerprint", "serve", "runtime-cache"),
    "Maintenance": ("verify", "gc", "backup", "restore"),
    "Access": ("role", "audit", "keys"),
}
OTHER_PANEL = "Other commands"
PANEL_OF = {name: panel for panel, names in PANELS.items() for name in names}


def flags_take_no_value(params: Iterable[Any]) -> None:
    """Show each boolean flag (`--json`, `--help`, `--worker/--no-worker`) in `--help` with no value
    placeholder: Typer's rich help gives every option its type, a flag too (`--json <bool>`), as if
    it took a value. What stands for an option's value there is its metavar; a flag's is empty."""
    for param in params:
        if isinstance(param, TyperOption) and param.is_flag and param.metavar is None:
            param.metavar = ""


class Command(TyperCommand):
    """Every command of the CLI (see `adopt`): its flags shown as flags in `--help`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        flags_take_no_value(self.get_params(ctx))  # the params with the help option, made on first use
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """Every group of the CLI, the root (`LazyGroup`) too: as `Command`."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        flags_take_no_value(self.get_params(ctx))
        super().format_help(ctx, formatter)


def adopt(commands: typer.Typer) -> None:
    """Make each command that a module registered on `commands` a `Command`, and each group a
    `Group`, at any depth, where it names no class of its own: a command module needs no `cls=`."""
    for command in commands.registered_commands:
        if command.cls in (None, TyperCommand):  # `app.command()` records TyperCommand where none is named
            command.cls = Command
    for group in commands.registered_groups:
        instance = group.typer_instance
        if isinstance(group.cls, DefaultPlaceholder) and (
            instance is None or isinstance(instance.info.cls, DefaultPlaceholder)
        ):
            group.cls = Group
        if instance is not None:
            adopt(instance)


class LazyGroup(Group):
    """The root group: commands come from their modules on first use (see the module docstring)."""

    help_from_table = True  # False: `--help` imports every module and lists its commands (the tests)

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False

    def list_commands(self, ctx: typer.Context) -> list[str]:  # type: ignore[override]
        """Every command, panel by panel (PANELS), then any other."""
        known = [*super().list_commands(ctx), *(name for name in COMMANDS if name not in self.commands)]
        grouped = [name for names in PANELS.values() for name in names if name in known]
        return grouped + [name for name in known if name not in grouped]

    def get_command(self, ctx: typer.Context, cmd_name: str) -> Any:  # type: ignore[override]
        """The command, in its help panel (PANEL_OF)."""
        command: Any  # Typer's commands and groups have a `rich_help_panel`; Click's type does not say so
        if cmd_name in self.commands or cmd_name not in COMMANDS:
            command = self.commands.get(cmd_name)
        elif self._listing and self.help_from_table:
            command = TyperCommand(name=cmd_name, help=COMMANDS[cmd_name][1])
        else:
            self._load(COMMANDS[cmd_name][0])
            command = self.commands.get(cmd_name)
        if command is not None:
            command.rich_help_panel = PANEL_OF.get(cmd_name, OTHER_PANEL)
        return command

    def _load(self, module: str) -> None:
        commands = typer.Typer()
        importlib.import_module(f"enginecache.cli.{module}").register(commands)
        adopt(commands)
        for name, command in typer.main.get_group(commands).commands.items():
            self.commands.setdefault(name, command)

    def format_help(self, ctx: typer.Context, formatter: Any) -> None:  # type: ignore[override]
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(
    name="enginecache",
    help="Build TensorRT engines once, load them in milliseconds.\n\n"
    "Start here: `enginecache model add FILE.onnx`, then `enginecache build NAME`.",
    no_args_is_help=True,
    cls=LazyGroup,
)


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
    logging.basicConfig(  # every library's logging on stderr: stdout is the command's output
        level=logging.INFO if verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    ctx.obj = CliSettings(home, db)


def main() -> None:
    """Entry point: map typed errors to a message and their kind's exit code, never a traceback.

    With --json, stdout carries exactly one JSON document, on failure too: the error as
    `{"error": message, "kind": kind, "exit_code": code}` (`cli.common.json_stdout`). SIGTERM ends
    the command as ^C does, through its cleanup (a one-shot worker hands its job back and goes offline).
    """
    with sigterm_exits(), json_stdout(wants_json(sys.argv[1:])):
        code = _run()
    sys.exit(code)


def wants_json(args: list[str]) -> bool:
    """Whether the command line asks for JSON output (a `--json` before any `--`)."""
    return "--json" in (args[: args.index("--")] if "--" in args else args)


def _run() -> int:
    try:
        result = app(standalone_mode=False)
        code = result if isinstance(result, int) else 0
    except typer.Exit as done:
        code = done.exit_code
    except EngineCacheError as err:
        error_line(str(err))
        code = exit_code_for(err)
        error_document(str(err), err.kind, code)
    except typer.Abort:
        code = EXIT_INTERRUPTED
        error_line("interrupted")
        error_document("interrupted", "interrupted", code)
    except typer.TyperException as err:  # usage errors: Typer's own Click raises them
        code = err.exit_code
        error_document(_usage_error(err), "usage", code)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else EXIT_FAILED
        if code <= 128:  # a library's own exit: rich's on a closed stdout (`| head`), whose output has nowhere to go
            return code
        error_line(f"stopped (exit status {code})")  # a signal: SIGTERM (see sigterm_exits)
        error_document(f"stopped (exit status {code})", "interrupted", code)
    except Exception as err:  # a bug: its traceback on stderr, and still one document on stdout
        error_line(f"internal error (a bug; its traceback follows): {type(err).__name__}: {err}")
        error_document(f"{type(err).__name__}: {err}", "internal", EXIT_FAILED)
        raise
    if code != 0:
        error_document(f"exit status {code}", KIND_BY_EXIT_CODE.get(code, "failed"), code)
    return code


def _usage_error(err: typer.TyperException) -> str:
    """Say what is wrong with the command line, as every other error is said (`error: ...` on
    stderr), then its usage and where the help is; return the message. A group called without a
    command (`enginecache model`) has printed its help instead, and says nothing more."""
    if type(err).__name__ == "NoArgsIsHelpError":  # as Typer tells it (the class is private)
        err.show()  # type: ignore[attr-defined]
        return "no command given"
    message = err.format_message()
    if message[1:2].islower():  # Click's sentences start upper case ("No such option"); ours do not
        message = message[0].lower() + message[1:]
    error_line(message)
    ctx = getattr(err, "ctx", None)
    if ctx is not None:
        typer.echo(ctx.get_usage(), err=True)
        if ctx.command.get_help_option(ctx) is not None:
            typer.echo(f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.", err=True)
    return message


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """SIGTERM raises SystemExit(143) in the main thread, so `finally` blocks run (where nobody
    else has claimed the signal)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) not in (
        signal.SIG_DFL,
        None,
    ):
        yield
        return

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


if __name__ == "__main__":
    main()
