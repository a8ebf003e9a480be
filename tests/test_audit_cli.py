"""`enginecache audit`: `--json` prints one document, newest first, filtered and paged; the text
shows control characters escaped; through the real entry point as well."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from enginecache.cli import auditcmd
from enginecache.cli.app import COMMANDS, LazyGroup
from enginecache.cli.common import CliSettings
from enginecache.service.access import audit
from enginecache.service.access.audit import Actor, acting_as, record
from enginecache.service.context import AppContext
from tests.auditkit import ALICE
from tests.clirunner import run_cli


def _cli(app: AppContext) -> typer.Typer:
    """`audit` on a fresh Typer app whose root callback points at `app`'s home and catalog."""
    cli = typer.Typer()

    @cli.callback()
    def root(ctx: typer.Context) -> None:
        ctx.obj = CliSettings(app.home, app.db_url)

    auditcmd.register(cli)
    return cli


def test_cli_audit_json_prints_one_document_newest_first(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    with acting_as(ALICE):
        record(app, audit.MODEL_REGISTER, "model 1", {"name": "mlp"})
        record(app, audit.ENGINE_RETIRE, "engine 2", {"was": "READY"})
    with acting_as(Actor("eve\x1b[2J", "cli box pid 1")):
        record(app, audit.JOB_CANCEL, "job 3")
    cli, runner = _cli(app), CliRunner()

    done = runner.invoke(cli, ["audit", "--json"])
    assert done.exit_code == 0, done.output
    listed = json.loads(done.stdout)  # the whole of stdout is one document
    assert [e["action"] for e in listed] == [audit.JOB_CANCEL, audit.ENGINE_RETIRE, audit.MODEL_REGISTER]
    assert set(listed[0]) == {"id", "at", "actor", "origin", "action", "target", "details"}
    assert (listed[1]["actor"], listed[1]["origin"], listed[1]["target"]) == (ALICE.name, ALICE.origin, "engine 2")
    assert listed[1]["details"] == {"was": "READY"} and listed[1]["at"].endswith("+00:00")

    only = json.loads(runner.invoke(cli, ["audit", "--action", audit.MODEL_REGISTER, "--json"]).stdout)
    assert [e["target"] for e in only] == ["model 1"]
    page = json.loads(runner.invoke(cli, ["audit", "--limit", "1", "--offset", "1", "--json"]).stdout)
    assert [e["id"] for e in page] == [listed[1]["id"]]
    assert json.loads(runner.invoke(cli, ["audit", "--action", "nothing.done", "--json"]).stdout) == []

    text = runner.invoke(cli, ["audit"])
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    assert len(lines) == 3 and "alice@example.com" in lines[1] and "engine.retire" in lines[1]
    assert lines[1].endswith("engine 2  status: READY -> RETIRED") and lines[2].endswith("model 1  name: mlp")
    assert "\x1b" not in text.stdout and "eve\\x1b[2J" in lines[0], "control characters are shown escaped"
    assert runner.invoke(cli, ["audit", "--help"]).exit_code == 0


AUDIT_COMMAND_LINE = "The audit log: every change, who made it, when and from where; newest first."


def test_cli_audit_through_the_real_entry_point(
    catalog_ctx: AppContext, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the COMMANDS entry cli/app.py is to get: the root help reads as the module's own, and
    `--json` writes exactly one document to stdout, on success and on a usage error."""
    monkeypatch.setitem(COMMANDS, "audit", ("auditcmd", AUDIT_COMMAND_LINE))
    from_table = run_cli(capsys, "--help")
    monkeypatch.setattr(LazyGroup, "help_from_table", False)
    assert run_cli(capsys, "--help").out == from_table.out  # the entry reads as the module's own help
    monkeypatch.setattr(LazyGroup, "help_from_table", True)

    with acting_as(ALICE):
        record(catalog_ctx, audit.ENGINE_RETIRE, "engine 9")
    where = ["--home", str(catalog_ctx.home), "--db", catalog_ctx.db_url]
    done = run_cli(capsys, *where, "audit", "--json")
    assert done.code == 0, done.err
    assert [(e["actor"], e["target"]) for e in done.json()] == [(ALICE.name, "engine 9")]
    refused = run_cli(capsys, *where, "audit", "--limit", "0", "--json")
    assert refused.code == 2 and refused.json()["kind"] == "usage"
