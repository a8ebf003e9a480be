"""How the `enginecache` console script exits (`cli.exiting`): what it made left out of the last garbage
collection, and everything else about exiting kept: the exit code, the output, atexit handlers and the
temporary directories they remove; not where a nanobind extension would report leaks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The console script's main, with an atexit handler registered first (so it runs last) that says
# how many objects the exit collection skips, and a temporary directory nobody cleans up: its
# finalizer is an atexit handler too.
WRAPPED = """
import atexit, gc, importlib, json, os, sys, tempfile
for name in filter(None, os.environ.get("PRELOAD", "").split(",")):
    importlib.import_module(name)
left = tempfile.TemporaryDirectory(prefix="enginecache-exit-")
atexit.register(lambda: print(json.dumps({"frozen": gc.get_freeze_count(), "tmp": left.name}), file=sys.stderr))
sys.argv = ["enginecache", *sys.argv[1:]]
from enginecache.cli.entry import main
main()
"""


def _run(home: Path, *args: str, preload: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ENGINECACHE_HOME": str(home), "PRELOAD": preload}
    env.pop("ENGINECACHE_DB_URL", None)
    return subprocess.run(
        [sys.executable, "-c", WRAPPED, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120
    )


def _exit_report(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    return json.loads(done.stderr.strip().splitlines()[-1])


def test_a_command_exits_with_its_objects_left_out_of_the_last_collection(tmp_path: Path) -> None:
    done = _run(tmp_path / "home", "model", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    report = _exit_report(done)
    assert isinstance(report["frozen"], int) and report["frozen"] > 10_000, report  # the ORM's and Typer's
    assert not Path(str(report["tmp"])).exists(), "an atexit finalizer did not run"


def test_a_failing_command_keeps_its_exit_code_and_its_one_json_document(tmp_path: Path) -> None:
    done = _run(tmp_path / "home", "model", "show", "nosuchmodel", "--json")
    assert done.returncode == 2, done.stderr
    assert json.loads(done.stdout)["kind"] == "not_found"
    report = _exit_report(done)
    assert isinstance(report["frozen"], int) and report["frozen"] > 0
    assert not Path(str(report["tmp"])).exists()


def test_with_a_nanobind_extension_loaded_the_exit_is_the_interpreters_own(tmp_path: Path) -> None:
    """LIEF (ModelOpt's) is built with nanobind, which reports objects alive at its teardown as leaks."""
    import importlib.util

    from tests.conftest import skip_or_fail

    if importlib.util.find_spec("lief") is None:
        skip_or_fail("lief is not installed (the modelopt extra)")
    done = _run(tmp_path / "home", "model", "list", "--json", preload="lief")
    assert done.returncode == 0, done.stderr
    assert _exit_report(done)["frozen"] == 0
    assert "nanobind" not in done.stderr, done.stderr
