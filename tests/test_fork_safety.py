"""No client with threads of its own crosses a fork: a process that has used the S3 client (obstore
runs a tokio runtime, whose threads a fork does not copy) starts each job attempt as a fresh
interpreter, and a copy that was forked anyway refuses to use the client instead of hanging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.modelfactory import make_mlp
from tests.s3kit import S3Server, running_server

# A matrix run that hangs is a failure, not a wait: this bounds it (it takes about 10 s).
HARD_TIMEOUT_SECONDS = 240


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


@pytest.mark.slow
def test_a_matrix_that_registers_a_new_model_with_an_s3_store_finishes(server: S3Server, tmp_path: Path) -> None:
    """The matrix registers `m` from its path (uploading it through the S3 client in the command's
    own process), then builds it in a one-shot worker: before the fix, the worker's zygote was a
    fork of that process and its child sat in the client's upload forever."""
    make_mlp(tmp_path / "m.onnx")
    matrix = tmp_path / "engines.yaml"
    matrix.write_text(yaml.safe_dump({"defaults": {"backend": "ort"}, "models": [{"name": "m", "path": "m.onnx"}]}))
    home = tmp_path / "home"
    env = {**os.environ, **server.env(f"matrix-{uuid.uuid4().hex[:10]}"), "ENGINECACHE_HOME": str(home)}
    env.pop("ENGINECACHE_DB_URL", None)
    done = subprocess.run(
        [sys.executable, "-m", "enginecache.cli", "build", "--matrix", str(matrix), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=HARD_TIMEOUT_SECONDS,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [cell] = json.loads(done.stdout)["cells"]
    assert (cell["model"], cell["outcome"]) == ("m", "built"), cell


def test_a_client_with_threads_makes_a_fork_unsafe() -> None:
    probe = (
        "import sys\n"
        "from enginecache.core import processes\n"
        "assert processes.fork_hazard() is None, processes.fork_hazard()\n"
        "processes.started_threads('a test client')\n"
        "print(processes.fork_hazard())\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "a test client" in done.stdout


def test_the_s3_client_refuses_to_run_in_a_fork_of_a_process_that_used_it(server: S3Server, tmp_path: Path) -> None:
    """A fork that happened anyway (not through enginecache) gets a StoreError naming the cause at
    once, never a hang."""
    probe = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from enginecache.core.store import remote_from_env\n"
        "from enginecache.errors import StoreError\n"
        "remote = remote_from_env()\n"
        "assert remote is not None and remote.stat_blob('0' * 64) is None\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        remote_from_env().stat_blob('0' * 64)\n"
        "    except StoreError as err:\n"
        "        print('refused:', err, flush=True)\n"
        "        os._exit(0)\n"
        "    os._exit(3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "sys.exit(os.waitstatus_to_exitcode(status))\n"
    )
    env = {**os.environ, **server.env(f"fork-{uuid.uuid4().hex[:10]}")}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "refused:" in done.stdout and "fork" in done.stdout
