"""The README's command line as a new user meets it: where the console script is after `make run`
(`.venv/bin/enginecache`, or `enginecache` in an activated shell), every make variable the
Makefile reads with its default, and examples that are real commands with real options."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import typer
from typer import _click as click  # Typer's own Click

from enginecache.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")


def make_variables() -> dict[str, str | None]:
    """Each variable a user may set for make: `NAME ?= default` (exported or not), and a bare
    `$(if $(NAME),...)` switch (no default)."""
    found: dict[str, str | None] = {
        name: default.strip()
        for name, default in re.findall(r"^(?:export\s+)?([A-Z][A-Z0-9_]*)\s*\?=(.*)$", MAKEFILE, re.MULTILINE)
    }
    for name in re.findall(r"\$\(if \$\(([A-Z][A-Z0-9_]*)\)", MAKEFILE):
        found.setdefault(name, None)
    return found


def shell_lines() -> list[str]:
    """The README's ```sh blocks, one command per line (continuations joined, comments dropped)."""
    lines: list[str] = []
    for block in re.findall(r"^```sh\n(.*?)^```", README, re.MULTILINE | re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("#", 1)[0].strip()
            if command:
                lines.append(command)
    return lines


def test_the_make_variables_are_all_found() -> None:
    assert set(make_variables()) == {"PYTHON", "ENGINECACHE_CORPUS", "ENGINECACHE_HOME", "PORT", "QUICK"}


def test_the_readme_documents_every_make_variable_and_its_default() -> None:
    rows = {name: row for name, row in re.findall(r"^\| `([A-Z][A-Z0-9_]*)` \|(.*)$", README, re.MULTILINE)}
    for name, default in make_variables().items():
        assert name in rows, f"the README's table of make variables has no row for {name}"
        if default is not None and re.fullmatch(r"[\w.]+", default):  # a plain value, as `PORT ?= 8501`
            assert f"`{default}`" in rows[name], f"{name}: the README does not give its default {default}"
    assert "make run PORT=" in README


def test_the_readme_says_where_the_console_script_is() -> None:
    examples = [i for i, line in enumerate(shell_lines()) if line.split()[0] == "enginecache"]
    hint = [i for i, line in enumerate(shell_lines()) if line.startswith(". .venv/bin/activate")]
    assert hint and examples and hint[0] < examples[0], "activate .venv before the first bare `enginecache`"
    assert ".venv/bin/enginecache" in README


def _command_for(words: list[str]) -> tuple[list[str], Any, list[str]]:
    """The command an example names, the words of its path and the rest of its words."""
    command: Any = typer.main.get_command(app)
    context = click.Context(command)
    path: list[str] = []
    rest = list(words)
    options = {opt for param in command.params for opt in param.opts}
    while rest and hasattr(command, "get_command"):
        if rest[0] in options:  # a global option: --home DIR, --db URL, -v
            rest = rest[2:] if rest[0] in ("--home", "--db") else rest[1:]
            continue
        if rest[0].startswith("-") and getattr(command, "invoke_without_command", False):
            break  # a group that runs alone (`audit --action ...`): its options follow
        found = command.get_command(context, rest[0])
        assert found is not None, f"`enginecache {' '.join(words)}`: no command {rest[0]!r}"
        command, path, rest = found, [*path, rest.pop(0)], rest
    return path, command, rest


def test_every_example_is_a_command_with_its_options() -> None:
    examples = [shlex.split(line)[1:] for line in shell_lines() if line.split()[0] == "enginecache"]
    assert len(examples) > 20
    for words in examples:
        if words == ["--help"]:
            continue
        path, command, rest = _command_for(words)
        runs_alone = getattr(command, "invoke_without_command", False)  # `audit` lists events, `audit verify` checks
        assert not hasattr(command, "get_command") or runs_alone, f"`enginecache {' '.join(words)}` names a group"
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)} | {"--help"}
        for word in rest:
            if word.startswith("--"):
                assert word.split("=", 1)[0] in known, (
                    f"`enginecache {' '.join(words)}`: {' '.join(path)} has no {word}"
                )
