"""`release rollback` of a model name the catalog does not have says so (a NotFound, exit 2, the
`not_found` error object with --json), as `release promote` does, instead of "no earlier target";
nothing is recorded. A known name with nothing to go back to still says "no earlier target"."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.errors import EXIT_BAD_INPUT, BadInputError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import aliases, rollback
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp


def test_rolling_back_an_alias_of_an_unknown_model_is_not_found(app_ctx: AppContext, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="no model named 'nope'"):
        rollback(app_ctx, "nope", "prod")
    assert audit.list_audit(app_ctx, action=audit.RELEASE_ROLLBACK) == []
    assert aliases(app_ctx, "nope") == [], "no alias move recorded"
    register_model(app_ctx, make_mlp(tmp_path / "m.onnx"), name="m")
    with pytest.raises(BadInputError, match="no earlier target"):
        rollback(app_ctx, "m", "prod")


def test_the_cli_says_there_is_no_such_model(app_ctx: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    text = run_cli(capsys, *where, "release", "rollback", "nope", "--alias", "prod")
    assert text.code == EXIT_BAD_INPUT == 2, text
    assert text.out == ""
    assert text.err.startswith("error: no model named 'nope'"), text.err
    assert "earlier target" not in text.err

    done = run_cli(capsys, *where, "release", "rollback", "nope", "--alias", "prod", "--json")
    assert done.code == EXIT_BAD_INPUT, done
    document = done.json()  # one JSON document on stdout, nothing else
    assert document == {"error": document["error"], "kind": NotFoundError.kind, "exit_code": EXIT_BAD_INPUT}
    assert document["error"].startswith("no model named 'nope'"), document
