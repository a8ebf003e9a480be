"""Layering: imports point dashboard -> service -> core, db; importing loads no GPU library."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GPU_MODULES = ("tensorrt", "tensorrt_rtx", "cuda", "pycuda", "torch", "modelopt")


@pytest.mark.slow
def test_importing_the_layers_loads_no_gpu_library() -> None:
    code = (
        "import json, sys, pkgutil, importlib\n"
        "import enginecache, enginecache.core, enginecache.db, enginecache.service, enginecache.cli\n"
        "for package in (enginecache,):\n"
        "    for info in pkgutil.walk_packages(package.__path__, package.__name__ + '.'):\n"
        "        skipped = ('.migrations' in info.name, info.name.endswith('__main__'))\n"
        "        if any(skipped) or info.name.startswith('enginecache.dashboard.views'):\n"
        "            continue\n"
        "        importlib.import_module(info.name)\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {list(GPU_MODULES)!r})))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_import_linter_contracts_hold() -> None:
    lint_imports = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint_imports is not None, "import-linter is a dev dependency"
    result = subprocess.run([lint_imports], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "3 kept, 0 broken" in result.stdout


def test_no_code_outside_the_backend_packages_switches_on_a_backend_name() -> None:
    """The backend owns its policy: elsewhere a backend is asked through its interface (or looked up
    in a table by name), never compared with a name's string. The check reads every tracked Python file."""
    needle = "backend" + " == "  # spelled apart, so this file does not match itself
    backends = ROOT / "enginecache" / "core" / "backends"
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [ROOT / name for name in listed.stdout.split()] or sorted(ROOT.glob("[!.]*/**/*.py"))
    switches = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        if backends not in path.parents and path.is_file()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if needle in line
    ]
    assert switches == []
