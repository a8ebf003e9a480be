"""`--json` is JSON: with it, stdout carries exactly one JSON document, on failure too (the error
object `{"error", "kind", "exit_code"}`), and every library's output (logging, print, C code, child
processes: ModelOpt's lines) goes to stderr. Without it, the same commands print text for people.

Every command that takes --json is enumerated from the Typer app and run in a success and a failure
case on a small catalog; `RECIPES` must cover each one, so a new --json command fails here until it
has its cases."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer

from enginecache.cli.app import app
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus
from enginecache.service.access.roles import set_role
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.context import AppContext
from enginecache.service.maintenance.backup.usecases import backup
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import promote
from tests.clirunner import run_cli
from tests.enginerows import engine_row_like
from tests.modelfactory import make_mlp

TIMEOUT = 300


def json_commands() -> list[str]:
    """Every command of the app (subcommands of groups too) that has a --json option, as 'job show'."""
    from typer import _click as click  # Typer's own Click

    root = typer.main.get_command(app)
    context = click.Context(root)
    found: list[str] = []

    def walk(group: Any, path: list[str]) -> None:
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            has_json = any("--json" in param.opts for param in command.params)
            if hasattr(command, "list_commands"):
                if has_json and getattr(command, "invoke_without_command", False):  # `audit` runs alone too
                    found.append(" ".join([*path, name]))
                walk(command, [*path, name])
            elif has_json:
                found.append(" ".join([*path, name]))

    walk(root, [])
    return found


@dataclass(frozen=True)
class Catalog:
    home: Path
    db: str
    model: str
    engine_id: int
    spare_engine_id: int  # what `engine retire` and `engine delete` take (the others use engine_id)
    rtx_engine_id: int  # a RETIRED rtx row sharing engine_id's blob: what `runtime-cache publish` takes
    job_id: int
    model_path: Path
    tmp: Path

    def argv(self, *args: str) -> list[str]:
        return ["--home", str(self.home), "--db", self.db, *args]


# command -> (success args, failure args, the failure's kind); `{...}` fields come from Catalog
_RTX_KEY = ["--cc", "sm89", "--rtx-version", "1.7.1", "--cuda-version", "12.9"]
RECIPES: dict[str, tuple[list[str], list[str], str]] = {
    "fingerprint": (["fingerprint"], ["fingerprint", "--no-such-option"], "usage"),
    "verify": (["verify", "--all"], ["verify", "999999"], "not_found"),
    "check": (["check", "{engine_id}"], ["check", "999999"], "not_found"),
    "build": (["build", "{model}", "--backend", "ort"], ["build", "no-such-model", "--backend", "ort"], "not_found"),
    "jobs": (["jobs"], ["jobs", "--limit", "0"], "usage"),
    "test-load": (["test-load", "{engine_id}"], ["test-load", "999999"], "not_found"),
    "ready": (["ready", "--model", "{model}", "--backend", "ort"], ["ready", "--model", "no-such-model"], "not_found"),
    "export": (
        ["export", "{tmp}/export", "--model", "{model}"],
        ["export", "{tmp}/export-missing", "--model", "no-such-model"],
        "not_found",
    ),
    "model add": (["model", "add", "{model_path}"], ["model", "add", "{tmp}/missing.onnx"], "bad_input"),
    "model list": (["model", "list"], ["model", "list", "--limit", "0"], "usage"),
    "model show": (["model", "show", "{model}"], ["model", "show", "no-such-model"], "not_found"),
    "engine list": (["engine", "list"], ["engine", "list", "--limit", "0"], "usage"),
    "engine show": (["engine", "show", "{engine_id}"], ["engine", "show", "999999"], "not_found"),
    "engine import": (  # a declared-only trt engine (TensorRT is not installed: nothing is read from it)
        [
            "engine",
            "import",
            "{model_path}",
            "--model",
            "{model}",
            "--backend",
            "trt",
            "--target",
            "sm86",
            "--precision",
            "fp16",
        ],
        ["engine", "import", "{tmp}/missing.plan", "--model", "{model}", "--backend", "rtx", "--precision", "fp32"],
        "bad_input",
    ),
    "engine confirm-load": (  # a READY engine: nothing to prove, said so
        ["engine", "confirm-load", "{engine_id}", "{model_path}"],
        ["engine", "confirm-load", "999999", "{model_path}"],
        "not_found",
    ),
    "engine retire": (["engine", "retire", "{spare_engine_id}"], ["engine", "retire", "999999"], "not_found"),
    "engine delete": (["engine", "delete", "{spare_engine_id}"], ["engine", "delete", "999999"], "not_found"),
    "job show": (["job", "show", "{job_id}"], ["job", "show", "999999"], "not_found"),
    "job cancel": (["job", "cancel", "{job_id}"], ["job", "cancel", "999999"], "not_found"),
    "gc": (["gc"], ["gc", "--grace-days", "-1"], "usage"),
    "profiles": (["profiles", "{model}"], ["profiles", "no-such-model"], "not_found"),
    "pull": (
        ["pull", "{model}", "--dest", "{tmp}/pulled"],
        ["pull", "no-such-model", "--dest", "{tmp}/none"],
        "not_found",
    ),
    "audit": (["audit"], ["audit", "--limit", "0"], "usage"),
    "audit verify": (["audit", "verify"], ["audit", "verify", "--head", "bogus"], "bad_input"),
    "release promote": (
        ["release", "promote", "{model}", "--alias", "canary"],
        ["release", "promote", "no-such-model", "--alias", "canary"],
        "not_found",
    ),
    # the fixture promoted `prod` three times: each rollback has somewhere to go; `never` was never set
    "release rollback": (
        ["release", "rollback", "{model}", "--alias", "prod"],
        ["release", "rollback", "{model}", "--alias", "never"],
        "bad_input",
    ),
    "release list": (["release", "list", "{model}"], ["release", "list", "{model}", "--bogus"], "usage"),
    "role set": (
        ["role", "set", "Viewer@Example.com", "viewer"],
        ["role", "set", "v@example.com", "root"],
        "bad_input",
    ),
    "role remove": (["role", "remove", "gone@example.com"], ["role", "remove", "nobody@example.com"], "not_found"),
    "role list": (["role", "list"], ["role", "list", "--no-such-option"], "usage"),
    "keys generate": (
        ["keys", "generate", "{tmp}/keys"],
        ["keys", "generate", "{tmp}/keys-bad", "--name", ".pool"],
        "signing_key",
    ),
    "keys list": (["keys", "list"], ["keys", "list", "--no-such-option"], "usage"),
    # the model file's bytes stand in for a TensorRT-RTX runtime cache (none can be made without an RTX GPU)
    "runtime-cache publish": (
        ["runtime-cache", "publish", "{rtx_engine_id}", "{model_path}", "--gpu", "RTX 4090", *_RTX_KEY],
        ["runtime-cache", "publish", "{engine_id}", "{model_path}", "--gpu", "G", *_RTX_KEY],
        "bad_input",  # an ort engine has no runtime cache
    ),
    "runtime-cache list": (["runtime-cache", "list"], ["runtime-cache", "list", "--engine", "x"], "usage"),
    "backup": (["backup", "{tmp}/backup-ok"], ["backup", "{home}"], "bad_input"),  # not inside the home
    # restore goes into an empty home of its own (a leading --home replaces the catalog's)
    "restore": (["--home", "{tmp}/restored", "restore", "{tmp}/backup"], ["restore", "{tmp}/no-backup"], "bad_input"),
}


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enginecache.cli", "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def _build(app: AppContext, request: BuildRequest) -> JobRecord:
    """What `enginecache build` does: submit the job, run it here (a one-shot worker), wait for it."""
    submitted = submit_build(app, request)
    assert submitted.job is not None, submitted.notes
    job = run_and_wait(app, submitted.job, timeout_seconds=TIMEOUT)
    assert job.status == JobStatus.SUCCEEDED and job.result_engine_id is not None, job.error
    return job


@pytest.fixture(scope="module")
def small_catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Catalog]:
    """A SQLite catalog with one model, its ort engine and the job that built it, a spare engine (for
    `engine retire` and `engine delete`), a role for `role remove` to remove and a backup for
    `restore` to restore: made in this process by the service
    calls the CLI's `model add`, `build`, `role set` and `backup` make (the commands themselves are
    what the tests below run)."""
    tmp = tmp_path_factory.mktemp("json")
    home = tmp / "home"
    model_path = make_mlp(tmp / "mlp.onnx")
    app = AppContext.from_settings(home)
    try:
        model = register_model(app, model_path).model
        assert model.name == "mlp"
        job = _build(app, BuildRequest(model="mlp", backend="ort"))
        spare = _build(app, BuildRequest(model="mlp", backend="ort", opt_level=1))  # a second engine, another key
        with app.catalog.read() as session:
            built = session.get(EngineRecord, job.result_engine_id)
        assert built is not None
        rtx = engine_row_like(app, built, backend="rtx", status=EngineStatus.RETIRED, retired_at=built.created_at)
        set_role(app, "gone@example.com", "viewer")  # what `role remove` removes
        for _ in range(3):  # what `release rollback` takes back, once with --json and once without
            promote(app, "mlp", "prod")
        backup(app, tmp / "backup")  # what the restore recipe restores
    finally:
        app.close()  # SQLite checkpoints its WAL: the CLI processes below see one consistent file
    yield Catalog(
        home=home,
        db=f"sqlite:///{home / 'catalog.db'}",
        model="mlp",
        engine_id=job.result_engine_id or 0,
        spare_engine_id=spare.result_engine_id or 0,
        rtx_engine_id=rtx.id or 0,
        job_id=job.id or 0,
        model_path=model_path,
        tmp=tmp,
    )


def _args(catalog: Catalog, template: list[str]) -> list[str]:
    fields = {k: str(v) for k, v in vars(catalog).items()}
    words = [word.format(**fields) for word in template]
    if words[0] == "--home":  # a home of its own, on its own SQLite catalog
        return [*words, "--json"]
    return catalog.argv(*words, "--json")


def test_recipes_cover_every_json_command() -> None:
    commands = json_commands()
    assert len(commands) >= 10  # the enumeration found the app's commands, groups included
    assert sorted(commands) == sorted(RECIPES), "a --json command without its cases here (or a stale one)"


@pytest.fixture(params=sorted(RECIPES))
def command(request: pytest.FixtureRequest) -> str:
    """Each --json command of `RECIPES` in turn."""
    return str(request.param)


def test_success_prints_one_json_document(
    command: str, small_catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    success, _, _ = RECIPES[command]
    result = run_cli(capsys, *_args(small_catalog, success))
    document = json.loads(result.out)  # exactly one document: anything more fails to parse
    if result.code != 0:  # a verdict that exits 1 (a probe saying "not ready") is still one document
        assert isinstance(document, dict) and result.code == 1, (result.code, result.out, result.err)
    assert not (isinstance(document, dict) and set(document) == {"error", "kind", "exit_code"}), result.out


# what the success case of a command needs again before it runs a second time, and the paths it
# writes to, given fresh ones (`{tmp}/export` -> `{tmp}/export-text`)
TEXT_SETUP: dict[str, list[str]] = {"role remove": ["role", "set", "gone@example.com", "viewer"]}
WRITES = ("{tmp}/export", "{tmp}/backup-ok", "{tmp}/restored", "{tmp}/keys")


def test_without_json_the_output_is_text(
    command: str, small_catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    success, _, _ = RECIPES[command]
    if command in TEXT_SETUP:
        assert run_cli(capsys, *_args(small_catalog, TEXT_SETUP[command])).code == 0
    words = [f"{word}-text" if word in WRITES else word for word in success]
    args = _args(small_catalog, words)[:-1]  # without the --json
    result = run_cli(capsys, *args)
    assert result.code in (0, 1), (result.code, result.err)  # 1: a verdict, as for --json
    assert result.out.strip(), f"{command} printed nothing"
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.out)  # text for people, not a JSON document


def test_failure_prints_the_error_object(
    command: str, small_catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    _, failure, kind = RECIPES[command]
    result = run_cli(capsys, *_args(small_catalog, failure))
    assert result.code != 0
    document = json.loads(result.out)
    assert set(document) == {"error", "kind", "exit_code"}, result.out
    assert document["kind"] == kind and document["exit_code"] == result.code
    assert document["error"]


@pytest.mark.slow
def test_a_failed_build_prints_the_error_object_from_a_real_process(tmp_path: Path) -> None:
    """The build runs (through a one-shot worker and its child) and fails: stdout is the error object."""
    home = tmp_path / "home"
    assert _cli(home, "model", "add", str(make_mlp(tmp_path / "m.onnx")), "--json").returncode == 0
    for blob in (home / "models").rglob("*.onnx"):
        blob.write_bytes(b"not an onnx model")  # the build's child cannot load it
    done = _cli(home, "build", "m", "--backend", "ort", "--json")
    assert done.returncode == 1, done.stderr
    document = json.loads(done.stdout)
    assert document["kind"] == "build_failed" and document["exit_code"] == 1
    assert document["error"].startswith("job 1 ") and f"error: {document['error']}" in done.stderr
    assert re.match(r"job 1 FAILED: engine 1 failed to build: ", document["error"]), document["error"]


def test_library_output_goes_to_stderr_in_a_real_process(tmp_path: Path) -> None:
    """print(), a logging handler made meanwhile, C-level writes to fd 1 and a child's stdout all
    land on stderr; stdout is the one document."""
    code = """
import logging, os, subprocess, sys
from enginecache.cli.common import emit, json_stdout
with json_stdout(True):
    print("print noise")
    logging.getLogger("lib").addHandler(logging.StreamHandler(sys.stdout))
    logging.getLogger("lib").warning("logging noise")
    os.write(1, b"fd noise\\n")
    subprocess.run([sys.executable, "-c", "print('child noise')"], check=True)
    emit({"ok": True}, True, "")
print("after")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, check=True)
    first, after = done.stdout.rsplit("}", 1)
    assert json.loads(first + "}") == {"ok": True} and after.strip() == "after"
    for noise in ("print noise", "logging noise", "fd noise", "child noise"):
        assert noise in done.stderr


@pytest.mark.slow
def test_modelopt_build_json_is_only_json(tmp_path: Path) -> None:
    """ModelOpt (fp16 autocast) logs while it converts; with --json those lines are on stderr."""
    pytest.importorskip("modelopt.onnx.autocast")
    home = tmp_path / "home"
    assert _cli(home, "model", "add", str(make_mlp(tmp_path / "m.onnx")), "--json").returncode == 0
    args = ["build", "m", "--backend", "ort", "--precision", "fp16", "--converter", "modelopt", "--json"]
    done = _cli(home, "-v", *args)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "READY"
    assert "modelopt" in done.stderr
