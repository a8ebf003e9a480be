"""The installed distribution is one import name, `enginecache`, holds no test code, and lives beside a
user's own `service` and `core` packages (common names in serving code) without colliding."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TEST_KIND_NAMES = (b"held_build", b"run_sleep", b"run_crash", b"jobkinds_for_tests")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip install .` would install, built from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "enginecache", source / "enginecache", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet"),
            *("--wheel-dir", str(out), str(source)),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    (built,) = out.glob("enginecache-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package_and_its_metadata(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/", 1)[0] for name in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"enginecache"}
    for package in ("core", "db", "service", "dashboard", "cli"):
        assert f"enginecache/{package}/__init__.py" in names
    assert "enginecache/db/migrations/env.py" in names  # Alembic's files travel with the package
    assert any(n.startswith("enginecache/db/migrations/versions/0001") for n in names)


@pytest.mark.slow
def test_the_wheel_holds_no_test_job_kinds_and_no_test_switch(wheel: Path) -> None:
    """Test-only job kinds live in tests/ (tests/jobkinds_for_tests.py), named to a worker as any added
    kinds are (ENGINECACHE_JOB_KINDS): no module of them and no ENGINECACHE_TEST_* switch ships."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        switches = [name for name in names if b"ENGINECACHE_TEST_" in archive.read(name)]
        test_kinds = [name for name in names if any(k in archive.read(name) for k in TEST_KIND_NAMES)]
    assert [name for name in names if re.search(r"test_?kinds|for_tests", name)] == []
    assert switches == []
    assert test_kinds == [], "the test kinds' names appear in the product"


@pytest.mark.slow
def test_installed_beside_user_packages_named_service_and_core(wheel: Path, tmp_path: Path) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)  # this environment's pip installs into it (`pip --python`)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    user = tmp_path / "user_project"
    for name in ("service", "core"):
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(f"WHO = 'user {name}'\n")
    # The product's dependencies come from this test's environment, appended after the fresh venv's own
    # site-packages (a .pth line adds a path; it runs no editable-install hook of that environment).
    site = Path(sysconfig.get_paths(vars={"base": str(env_dir), "platbase": str(env_dir)})["purelib"])
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    code = (
        "import service, core, enginecache\n"
        "from enginecache import RuntimeSpec, load_or_build, EngineRejectedError\n"
        "import enginecache.service.serving.runtime as runtime\n"
        "assert service.WHO == 'user service' and core.WHO == 'user core', (service, core)\n"
        f"assert enginecache.__file__.startswith({str(site)!r}), enginecache.__file__\n"
        "assert runtime.load_or_build is load_or_build and RuntimeSpec().precision == 'fp32'\n"
        "assert issubclass(EngineRejectedError, enginecache.EngineCacheError)\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(
        [str(python), "-c", code], cwd=user, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == "ok"
