"""`enginecache backup` and `enginecache restore` (cli.backupcmd) through the real entry point: one
JSON document each, a refusal's kind, progress on stderr."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.cli.app import COMMANDS, LazyGroup
from enginecache.cli.backupcmd import backup as backup_command
from enginecache.cli.backupcmd import restore as restore_command
from enginecache.db.catalog import head_revision
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp


def test_cli_backup_and_restore_print_one_json_document(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the real entry point, with the two COMMANDS entries cli/app.py is to get."""
    for name, command in (("backup", backup_command), ("restore", restore_command)):
        monkeypatch.setitem(COMMANDS, name, ("backupcmd", (command.__doc__ or "").splitlines()[0]))
    from_table = run_cli(capsys, "--help")
    monkeypatch.setattr(LazyGroup, "help_from_table", False)
    assert run_cli(capsys, "--help").out == from_table.out  # the entries read as the module's own help
    monkeypatch.setattr(LazyGroup, "help_from_table", True)

    register_model(app_ctx, make_mlp(tmp_path / "src" / "alpha.onnx"), name="alpha")
    build_engine(app_ctx, BuildRequest(model="alpha", backend="ort"))
    home, dest, restored = str(app_ctx.home), tmp_path / "backup", tmp_path / "restored"

    made = run_cli(capsys, "--home", home, "backup", str(dest), "--json")
    assert made.code == 0, made.err
    assert made.json()["dest"] == str(dest) and made.json()["blobs"] == 1

    put = run_cli(capsys, "--home", str(restored), "restore", str(dest), "--json")
    assert put.code == 0, put.err
    assert put.json()["home"] == str(restored) and put.json()["revision"] == head_revision()

    again = run_cli(capsys, "--home", str(restored), "restore", str(dest), "--json")
    assert again.code == 2
    assert again.json()["kind"] == "bad_input" and "is not empty" in again.json()["error"]

    text = run_cli(capsys, "--home", home, "backup", str(tmp_path / "second"))
    assert text.code == 0 and "written to" in text.out
    assert "copied and verified" in text.err  # progress on stderr, never in the output
