"""One style for every error message of the CLI: `error: ...` on stderr, first thing, whatever the path
(a usage error, a typed error of the service, a command's own refusal, an interrupt, a stop, a bug),
with the usage after a usage error; with --json the same message is the error object's. A failed
build names its job and its engine each by kind and id. Exit codes per kind: test_cli_exit_codes.py."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import typer

from enginecache.cli.app import main
from enginecache.cli.common import job_error
from enginecache.service.fleet import thishost
from tests.clirunner import CliResult, run_cli
from tests.modelfactory import make_mlp

USAGE_ERRORS = {
    "no such option": (["model", "list", "--bogus"], "error: no such option: --bogus"),
    "a bad value": (["model", "list", "--limit", "0"], "error: invalid value for '--limit'"),
    "a missing argument": (["engine", "show"], "error: missing argument"),
    "not an integer": (["engine", "show", "abc"], "error: invalid value for 'engine_id'"),
    "no such command": (["no-such-command"], "error: no such command 'no-such-command'"),
}
REFUSALS = {  # a typed error of the service, or the command's own refusal
    "no such engine": (["engine", "show", "999999"], "error: no engine with id 999999 in the catalog"),
    "no such job": (["job", "show", "999999"], "error: no job with id 999999 in the catalog"),
    "no such model": (["model", "show", "nope"], "error: no model 'nope' in the catalog"),
    "no model file": (["model", "add", "{tmp}/missing.onnx"], "error: "),
    "verify of nothing": (["verify"], "error: name engine ids or --model, or pass --all"),
    "ready of nothing": (["ready"], "error: give --model (the catalog check) or --state"),
}


def _cli(capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], *extra: str) -> CliResult:
    words = [word.format(tmp=tmp_path) for word in args]
    return run_cli(capsys, "--home", str(tmp_path / "home"), *words, *extra)


def _same_message_as_json(text: CliResult, as_json: CliResult) -> None:
    """The --json run fails alike, its one document carrying the message stderr starts with."""
    assert as_json.code == text.code
    document = json.loads(as_json.out)
    assert set(document) == {"error", "kind", "exit_code"}
    assert as_json.err.splitlines()[0] == f"error: {document['error']}"


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_a_usage_error_says_error_first_then_the_usage(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args, start = USAGE_ERRORS[case]
    result = _cli(capsys, tmp_path, args)
    assert result.code == 2, result.err
    assert result.err.startswith(start), result.err
    lines = result.err.splitlines()
    assert lines[1].startswith("Usage: enginecache"), result.err  # after the message, the usage
    assert "Try 'enginecache" in result.err and "Error:" not in result.err
    _same_message_as_json(result, _cli(capsys, tmp_path, args, "--json"))


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refusal_says_error_first(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args, start = REFUSALS[case]
    result = _cli(capsys, tmp_path, args)
    assert result.code != 0
    assert result.err.startswith(start), result.err
    assert result.out == "" and "Traceback" not in result.err
    _same_message_as_json(result, _cli(capsys, tmp_path, args, "--json"))


@pytest.mark.parametrize(
    ("raised", "start", "code"),
    [
        (typer.Abort(), "error: interrupted", 130),
        (SystemExit(143), "error: stopped (exit status 143)", 143),  # SIGTERM (app.sigterm_exits)
    ],
    ids=["interrupted", "stopped"],
)
def test_an_interrupted_command_says_error_first(
    raised: BaseException,
    start: str,
    code: int,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def interrupted(**_kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(thishost, "host_fingerprint", interrupted)
    result = _cli(capsys, tmp_path, ["fingerprint"])
    assert result.code == code and result.err.startswith(start), (result.code, result.err)
    _same_message_as_json(result, _cli(capsys, tmp_path, ["fingerprint"], "--json"))


def test_a_bug_says_error_first_then_its_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(**_kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(thishost, "host_fingerprint", broken)
    monkeypatch.setattr(sys, "argv", ["enginecache", "fingerprint"])
    with pytest.raises(RuntimeError, match="boom"):  # the entry point raises it on: Python prints the traceback
        main()
    assert capsys.readouterr().err.startswith(
        "error: internal error (a bug; its traceback follows): RuntimeError: boom"
    )


@pytest.mark.slow
def test_a_failed_build_names_the_job_and_the_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = ["--home", str(tmp_path / "home")]
    assert run_cli(capsys, *home, "model", "add", str(make_mlp(tmp_path / "m.onnx"))).code == 0
    for blob in (tmp_path / "home" / "models").rglob("*.onnx"):
        blob.write_bytes(b"not an onnx model")  # the build fails on it
    failed = run_cli(capsys, *home, "build", "m", "--backend", "ort")
    assert failed.code == 1, failed.err
    (job,) = run_cli(capsys, *home, "jobs", "--json").json()
    (engine,) = run_cli(capsys, *home, "engine", "list", "--json").json()
    assert job["status"] == "FAILED" and engine["status"] == "FAILED"
    message = re.search(r"^error: job (\d+) FAILED: engine (\d+) failed to build: .+$", failed.err, re.MULTILINE)
    assert message, failed.err
    assert (int(message[1]), int(message[2])) == (job["id"], engine["id"])
    assert f"build {engine['id']} failed" not in failed.err, "an engine id is never a 'build' beside a job id"
    shown = run_cli(capsys, *home, "job", "show", str(job["id"])).out
    assert f"failure: engine {engine['id']} failed to build: " in shown


def test_job_error_names_the_engine_by_kind() -> None:
    assert job_error("build 27 failed: no space", 27) == "engine 27 failed to build: no space"
    assert job_error("engine 27 failed to build: no space", 27) == "engine 27 failed to build: no space"
    assert job_error("build 27 failed: x", 28) == "build 27 failed: x", "only the job's own engine is renamed"
    assert job_error("the worker's host differs", None) == "the worker's host differs"
    assert job_error(None, None) == "no error recorded"


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`enginecache --help | head -1`: the reader went away; the command stops with no error line
    (as any Unix tool does), not "error: stopped". The pipe's read end is closed before the command
    starts, so its first write meets the closed pipe."""
    import os
    import subprocess
    import sys

    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "enginecache.cli", "--home", str(tmp_path), "--help"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.returncode != 0
    assert "error:" not in done.stderr and "Traceback" not in done.stderr, done.stderr
