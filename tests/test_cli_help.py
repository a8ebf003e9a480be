"""`--help` of every command and group, as a person reads it (Typer's rich help): a boolean flag
(`--json`, `--help`, `--worker/--no-worker`) is shown as a flag, with no value placeholder after
it, and an option that takes a value still shows what it takes. The commands are enumerated from
the app, so a new command is checked as soon as it is registered."""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer import _click as click  # Typer's own Click
from typer.core import TyperOption

from enginecache.cli.app import app
from tests.clirunner import run_cli

WIDE = "250"  # columns: no row of the options panel wraps


def every_command() -> list[tuple[list[str], Any]]:
    """Each command path of the app with its Click command, the root and the groups too."""
    root = typer.main.get_command(app)
    context = click.Context(root)
    found: list[tuple[list[str], Any]] = []

    def walk(command: Any, path: list[str]) -> None:
        found.append((path, command))
        if hasattr(command, "list_commands"):
            for name in command.list_commands(context):
                walk(command.get_command(context, name), [*path, name])

    walk(root, [])
    return found


COMMANDS = every_command()


def _options(command: Any) -> list[TyperOption]:
    options = [p for p in command.params if isinstance(p, TyperOption) and not p.hidden]
    help_option = command.get_help_option(click.Context(command))
    return [*options, *([help_option] if help_option is not None else [])]


def _row(help_text: str, option: TyperOption) -> str:
    """The option's row of the options panel, from its names on: names, what it takes, its help."""
    for line in help_text.splitlines():
        row = line.strip().strip("│").strip().removeprefix("*").strip()  # `*`: required
        if line.strip().startswith("│") and row.split()[:1] == [option.opts[0]]:
            return row
    raise AssertionError(f"no row for {option.opts[0]} in:\n{help_text}")


def _takes(row: str, option: TyperOption) -> str:
    """What the row shows between the option's names and its help: the value it takes."""
    names = [*option.opts, *option.secondary_opts]
    rest = row[max(row.rfind(name) + len(name) for name in names if name in row) :].strip()
    start = " ".join((option.help or "").split()[:3])
    return rest.split(start, 1)[0].strip() if start else rest


def test_the_enumeration_finds_flags_and_options_that_take_values() -> None:
    paths = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "engine", "engine show", "serve", "build", "worker", "gc", "backup"} <= paths
    flags = [o for _, c in COMMANDS for o in _options(c) if o.is_flag]
    assert {"--json", "--help", "--verbose", "--worker", "--apply"} <= {o.opts[0] for o in flags}


@pytest.mark.parametrize(("path", "command"), COMMANDS, ids=[" ".join(p) or "(root)" for p, _ in COMMANDS])
def test_help_shows_flags_as_flags(
    path: list[str], command: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", WIDE)
    shown = run_cli(capsys, *path, "--help")
    assert shown.code == 0, shown.err
    assert "<bool>" not in shown.out
    for option in _options(command):
        takes = _takes(_row(shown.out, option), option)
        where = f"{' '.join(path) or 'enginecache'} {option.opts[0]}"
        if option.is_flag:
            assert takes == "", f"{where} is shown as taking a value: {takes!r}"
        else:
            assert re.fullmatch(r"\S+( \[.*\])?", takes), f"{where} shows no value it takes: {takes!r}"


def test_a_group_called_without_a_command_shows_its_help_with_flags_as_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", WIDE)
    shown = run_cli(capsys, "engine")
    assert "Usage" in shown.out and "<bool>" not in shown.out
    assert "error:" not in shown.err, "the help is not an error message"


def _panels(help_text: str) -> list[tuple[str, list[str]]]:
    """The root help's panels in order: (title, the commands listed in it)."""
    found: list[tuple[str, list[str]]] = []
    for line in help_text.splitlines():
        title = re.match(r"╭─ (.+?) ─", line)
        if title:
            found.append((title.group(1), []))
        elif found and line.startswith("│ ") and line[2:3] not in (" ", "-"):
            found[-1][1].append(line[2:].split()[0])
    return [(title, names) for title, names in found if title != "Options"]


@pytest.mark.parametrize("from_table", [True, False], ids=["from the table", "from the modules"])
def test_the_root_help_groups_the_commands_and_starts_with_model_add_and_build(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, from_table: bool
) -> None:
    """Issue 28: `--help` was one flat list of 21 commands with `model add` and `build` near the bottom."""
    from enginecache.cli import app as cli_app

    monkeypatch.setenv("COLUMNS", WIDE)
    monkeypatch.setattr(cli_app.LazyGroup, "help_from_table", from_table)
    shown = run_cli(capsys, "--help")
    assert shown.code == 0, shown.err
    panels = _panels(shown.out)
    assert [title for title, _ in panels] == [
        "Models",
        "Engines and builds",
        "Serving and fleet",
        "Maintenance",
        "Access",
    ]
    assert panels[0][1][0] == "model" and panels[1][1][0] == "build", "a new user's two commands first"
    listed = [name for _, names in panels for name in names]
    assert sorted(listed) == sorted(cli_app.COMMANDS), "every command once, each in a panel"
    assert "Start here: `enginecache model add FILE.onnx`, then `enginecache build NAME`." in shown.out
    model_help = run_cli(capsys, "model", "--help").out
    assert model_help.index("│ add") < model_help.index("│ list"), "`model add` heads its group"
