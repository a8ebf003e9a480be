"""The serving state file and `enginecache ready --state`: the serving process's real state, checked
without re-hashing the engine, opening the catalog or importing a runtime."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from enginecache.cli.probe import fast_main, parse_probe_args
from enginecache.service.context import AppContext
from enginecache.service.serving import runtime, servestate
from enginecache.service.serving.runtime import load_or_build
from enginecache.service.serving.servestate import check_state
from tests.clirunner import run_cli
from tests.conftest import corrupt_blob
from tests.servingkit import ORT, Served, run_python, serve_mlp


@pytest.fixture
def served(app_ctx: AppContext, tmp_path: Path) -> Served:
    return serve_mlp(app_ctx, tmp_path / "src")


def _rewrite(path: Path, **changes: object) -> None:
    state = json.loads(path.read_text())
    state.update(changes)
    path.write_text(json.dumps(state))


def test_a_verified_load_writes_the_state_and_close_removes_it(served: Served, tmp_path: Path) -> None:
    state_file = tmp_path / "run" / "serving.json"
    loaded = load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail", state_file=state_file)
    state = json.loads(state_file.read_text())
    assert state["pid"] == os.getpid() and state["engine"]["id"] == served.engine.id
    assert state["engine"]["blob"] == str(served.blob) and state["engine"]["verified"] == {
        "blake3": served.engine.blake3
    }
    assert state["model"] == {"name": "mlp", "path": str(served.onnx_path), "digest": loaded.onnx_digest}
    assert state["spec"]["backend"] == "ort" and state["boot_id"] == servestate.boot_id()
    ready = check_state(state_file)
    assert ready.ready and ready.reason.startswith(f"engine {served.engine.id} (mlp ort fp32) loaded and verified")
    loaded.close()
    assert not state_file.exists()
    gone = check_state(state_file)
    assert not gone.ready and "no serving state" in gone.reason


def test_the_state_file_can_come_from_the_environment(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state_file = tmp_path / "serving.json"
    monkeypatch.setenv(runtime.STATE_FILE_ENV, str(state_file))
    with load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail"):
        assert check_state(state_file).ready
    assert not state_file.exists()


def test_not_ready_once_the_blob_changes(served: Served, tmp_path: Path) -> None:
    state_file = tmp_path / "serving.json"
    loaded = load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail", state_file=state_file)
    corrupt_blob(served.blob)
    os.utime(served.blob, ns=(0, 10**9))  # an mtime that differs on any file system's granularity
    changed = check_state(state_file)
    assert not changed.ready and "changed since it was verified" in changed.reason and "mtime_ns" in changed.reason
    served.blob.unlink()
    assert "gone from the store" in check_state(state_file).reason
    loaded.close()


def test_not_ready_when_the_process_is_gone_reused_or_from_another_boot(served: Served, tmp_path: Path) -> None:
    state_file = tmp_path / "serving.json"
    code = (
        "import json\n"
        "from enginecache import RuntimeSpec, load_or_build\n"
        f"e = load_or_build({str(served.onnx_path)!r}, spec=RuntimeSpec(backend='ort'), home={str(served.app.home)!r},"
        f" on_miss='fail', state_file={str(state_file)!r})\n"
        "print(json.dumps({'engine': e.engine_id}))\n"  # exits without close(): the file stays
    )
    assert run_python(code) == {"engine": served.engine.id}
    gone = check_state(state_file)
    assert not gone.ready and "is gone" in gone.reason
    _rewrite(state_file, pid=os.getpid())  # a live pid, started at another time
    assert "pid reused" in check_state(state_file).reason
    _rewrite(state_file, start_ticks=servestate.process_start_ticks(os.getpid()))
    assert check_state(state_file).ready
    _rewrite(state_file, boot_id="another-boot")
    assert "another boot" in check_state(state_file).reason
    state_file.write_text("{not json")
    assert "unreadable" in check_state(state_file).reason


def test_process_start_ticks_reads_past_a_command_name_with_spaces_and_parentheses() -> None:
    assert servestate.process_start_ticks(os.getpid()) is not None
    assert servestate.process_start_ticks(2**22 + 12345) is None


def test_the_fast_dispatch_answers_only_the_state_probe() -> None:
    assert parse_probe_args(["ready", "--state", "/run/s.json"]) == (Path("/run/s.json"), False)
    assert parse_probe_args(["--home", "/h", "--db=sqlite:///x", "-v", "ready", "--state=/s", "--json"]) == (
        Path("/s"),
        True,
    )
    for argv in (
        [],
        ["ready"],
        ["ready", "--model", "m"],
        ["ready", "--state", "/s", "--model", "m"],
        ["ready", "--state", "/s", "--help"],
        ["--unknown", "ready", "--state", "/s"],
        ["build", "--state", "/s"],
    ):
        assert parse_probe_args(argv) is None, argv
        assert fast_main(argv) is None


def test_the_probe_in_a_new_process_imports_no_cli_framework_orm_or_runtime(served: Served, tmp_path: Path) -> None:
    state_file = tmp_path / "serving.json"
    loaded = load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail", state_file=state_file)
    heavy = ("typer", "click", "sqlalchemy", "sqlmodel", "onnxruntime", "numpy", "blake3", "enginecache.core")
    code = (
        "import contextlib, io, json, sys\n"
        "from enginecache.cli.probe import fast_main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    code = fast_main(['--home', '/nowhere', 'ready', '--state', {str(state_file)!r}, '--json'])\n"
        f"print(json.dumps({{'code': code, 'out': json.loads(out.getvalue()),"
        f" 'heavy': [m for m in {heavy!r} if m in sys.modules]}}))\n"
    )
    result = run_python(code)
    assert result["code"] == 0 and result["heavy"] == []
    assert result["out"]["ready"] is True and result["out"]["engine_id"] == served.engine.id
    assert result["out"]["pid"] == os.getpid()
    loaded.close()


def test_the_cli_ready_command_takes_a_state_file(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state_file = tmp_path / "serving.json"
    with load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail", state_file=state_file):
        ok = run_cli(capsys, "ready", "--state", str(state_file), "--json")
        assert ok.code == 0 and ok.json()["ready"] is True
    closed = run_cli(capsys, "ready", "--state", str(state_file))
    assert closed.code == 1 and closed.out.startswith("not ready: no serving state")
    neither = run_cli(capsys, "ready")
    assert neither.code == 2 and "--model" in neither.err and "--state" in neither.err
