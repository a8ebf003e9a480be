"""`enginecache gc --json` through the CLI: exactly one document on stdout, the logs (-v) on
stderr, and the text output of a dry run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from enginecache.service.context import AppContext
from tests.clirunner import run_cli
from tests.gckit import BOUND, HOUR, ROOT, set_age


@pytest.mark.slow
def test_gc_json_is_exactly_one_document_and_logs_go_to_stderr(
    app_ctx: AppContext, capsys: pytest.CaptureFixture[str]
) -> None:
    app = app_ctx
    orphan = app.store.write_blob([b"orphan"])
    set_age(orphan.path, 2 * HOUR)
    dry = run_cli(capsys, "--home", str(app.home), "--db", app.db_url, "gc", "--json")
    assert dry.code == 0, dry.err
    assert json.loads(dry.out)["remove"][0]["path"] == app.store.relative(orphan.path)  # one document, nothing else
    applied = subprocess.run(  # a process of its own: the -v logging goes to its stderr, not to pytest's
        [
            sys.executable,
            "-m",
            "enginecache.cli",
            "-v",
            "--home",
            str(app.home),
            "--db",
            app.db_url,
            "gc",
            "--apply",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    document, end = json.JSONDecoder().raw_decode(applied.stdout)
    assert applied.stdout[end:].strip() == ""  # exactly one document
    assert document["applied"] is True and document["remove"][0]["path"] == app.store.relative(orphan.path)
    assert "gc removed 1 entries" in applied.stderr
    assert not orphan.path.exists()
    text = run_cli(capsys, "--home", str(app.home), "--db", app.db_url, "gc")
    assert text.code == 0 and "would remove 0 entries" in text.out
