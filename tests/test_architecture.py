"""Layering: imports point dashboard -> service -> core, db; importing loads no GPU library."""

from __future__ import annotations

import ast
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
    assert "4 kept, 0 broken" in result.stdout
    assert "cli and dashboard see only service: nothing from core or db KEPT" in result.stdout


def _tracked_python_files() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / name for name in listed.stdout.split() if (ROOT / name).is_file()]


def test_no_code_outside_the_backend_packages_switches_on_a_backend_name() -> None:
    """The backend owns its policy: elsewhere in the product a backend is asked through its
    interface, or looked up in a table by name; no comparison of any kind (==, !=, in, either
    side) has a backend's name as a string operand. And, across every tracked file, tests and
    benchmarks too, no line compares `backend` with `==` and a space (the issue's own grep)."""
    from enginecache.core.backends.registry import all_backends

    names = {backend.name for backend in all_backends()}
    backends = ROOT / "enginecache" / "core" / "backends"
    files = [path for path in _tracked_python_files() if backends not in path.parents]
    needle = "backend" + " == "  # spelled apart, so this file does not match itself
    literal = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in files
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if needle in line
    ]
    compared = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
        for path in files
        if (ROOT / "enginecache") in path.parents
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(_names_a_backend(operand, names) for operand in [node.left, *node.comparators])
    ]
    assert literal == [] and compared == []


def _names_a_backend(node: ast.expr, names: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return node.value in names
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_a_backend(item, names) for item in node.elts)
    return False
