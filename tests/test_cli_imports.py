"""A CLI that loads only what a command needs: `--help` and the read commands, run in a new process,
import no service code, neither SQLAlchemy nor the core library (the stdlib reader answers them),
and the root help the command table gives is what the command modules register."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from enginecache.cli import app as cli_app
from enginecache.service.context import AppContext
from tests.clirunner import run_cli
from tests.test_cli_listing import seed

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("sqlalchemy", "sqlmodel", "alembic", "onnx", "onnxruntime", "numpy", "tensorrt_rtx")

PROBE = """
import contextlib, io, json, sys
sys.argv = ["enginecache", *json.loads(sys.argv[1])]
from enginecache.cli.app import main
out = io.StringIO()
code = 0
with contextlib.redirect_stdout(out):
    try:
        main()
    except SystemExit as done:
        code = done.code or 0
print(json.dumps({"code": code, "out": out.getvalue(), "modules": sorted({m.split(".")[0] for m in sys.modules})}))
"""


def _probe(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(list(args))],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


HELPS = [
    [],  # no arguments: the help
    ["--help"],
    ["model", "--help"],
    ["model", "list", "--help"],
    ["engine", "list", "--help"],
    ["engine", "show", "--help"],
    ["jobs", "--help"],
    ["job", "show", "--help"],
    ["build", "--help"],
    ["worker", "--help"],
    ["serve", "--help"],
    ["verify", "--help"],
    ["fingerprint", "--help"],
]


@pytest.mark.slow
@pytest.mark.parametrize("args", HELPS, ids=lambda args: " ".join(args) or "(none)")
def test_help_imports_no_service_code(args: list[str]) -> None:
    probed = _probe(*args)
    assert probed["code"] in (0, 2), probed
    assert "Usage" in probed["out"]
    assert not set(HEAVY) & set(probed["modules"]), f"--help imported {set(HEAVY) & set(probed['modules'])}"


@pytest.mark.slow
def test_read_commands_import_neither_sqlalchemy_nor_the_core_library(app_ctx: AppContext) -> None:
    seed(app_ctx)
    env = {"PATH": "/usr/bin:/bin", "ENGINECACHE_HOME": str(app_ctx.home)}
    for args in (
        ["model", "list"],
        ["model", "show", "model-1"],
        ["engine", "list", "--json"],
        ["engine", "show", "3"],
        ["jobs"],
        ["job", "show", "2"],  # a FAILED job: no routing
    ):
        probed = _probe(*args, env=env)
        assert probed["code"] == 0, probed
        assert not set(HEAVY) & set(probed["modules"]), f"{args} imported {set(HEAVY) & set(probed['modules'])}"


def test_root_help_lists_each_command_as_its_module_does(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from_table = run_cli(capsys, "--help")
    monkeypatch.setattr(cli_app.LazyGroup, "help_from_table", False)
    from_modules = run_cli(capsys, "--help")
    assert from_table.code == from_modules.code == 0
    assert from_table.out == from_modules.out, "update cli.app.COMMANDS: a command or its help changed"


def test_the_table_names_every_command_the_modules_register() -> None:
    import importlib

    import typer

    registered: dict[str, str] = {}
    for module in sorted({module for module, _ in cli_app.COMMANDS.values()}):
        commands = typer.Typer()
        importlib.import_module(f"enginecache.cli.{module}").register(commands)
        for name in typer.main.get_group(commands).commands:
            registered[name] = module
    assert registered == {name: module for name, (module, _) in cli_app.COMMANDS.items()}


def test_serve_defaults_are_the_services() -> None:
    from enginecache.cli import serve as cli_serve
    from enginecache.service.access import serve

    assert (cli_serve.DEFAULT_PORT, cli_serve.DEFAULT_MAX_UPLOAD_MB) == (
        serve.DEFAULT_PORT,
        serve.DEFAULT_MAX_UPLOAD_MB,
    )
