"""Bounded input on a full disk: "unavailable" (exit 3), never "bad input", and nothing left behind.

The full disks are real: a 1 MiB tmpfs mounted for the test (root only; skipped with the reason
elsewhere, failing under CI=true)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from enginecache.dashboard.uploads import (
    extract_archive,
)
from enginecache.db.models import ModelRecord
from enginecache.errors import StoreError
from enginecache.service.builds.submit import list_jobs
from enginecache.service.context import DB_URL_ENV, AppContext
from tests.boundedkit import GIB, assert_nothing_extracted, dashboard_upload_error, mount, tar_of, upload
from tests.clirunner import run_cli
from tests.conftest import files_under
from tests.dashboardkit import serve_home
from tests.modelfactory import make_mlp


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), unmounted after the test."""
    where = tmp_path / "small"
    where.mkdir()
    mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(fs: Path, leave: int = 0) -> None:
    """Fill the filesystem at `fs` up to `leave` free bytes."""
    st = os.statvfs(fs)
    with open(fs / "filler", "wb") as out:
        out.write(bytes(max(0, st.f_bavail * st.f_frsize - leave)))


# -- a full disk: unavailable (exit 3), nothing left behind -----------------------------------


def test_cli_model_add_on_a_full_store_exits_3(
    small_fs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guard: the store's own writes already say StoreError (this passed before the work too)."""
    model = make_mlp(tmp_path / "big" / "mlp.onnx", features=512, hidden=512)  # 2 MiB, the store has 1
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    home = small_fs / "home"
    result = run_cli(capsys, "--home", str(home), "--db", catalog, "model", "add", str(model))
    assert result.code == 3, result.err
    assert "No space left on device" in result.err
    assert files_under(home / "tmp") == [] and files_under(home / "models") == []


def test_an_archive_extracted_onto_a_full_disk_is_a_store_error_and_leaves_nothing(
    small_fs: Path, tmp_path: Path
) -> None:
    model = make_mlp(tmp_path / "mlp.onnx", features=512, hidden=512).read_bytes()
    archive = tar_of([("folder/", None), ("folder/mlp.onnx", model)], mode="w:gz")
    dest = small_fs / "staging" / "upload"
    with pytest.raises(StoreError) as exc:
        extract_archive(upload("model.tar.gz", archive), dest, max_extract_bytes=GIB)
    assert "'folder/mlp.onnx'" in str(exc.value) and "No space left on device" in str(exc.value)
    assert_nothing_extracted(dest)


def test_a_dashboard_upload_onto_a_full_store_says_unavailable_not_rejected(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = small_fs / "home"
    serve_home(home, monkeypatch)
    monkeypatch.setenv(DB_URL_ENV, f"sqlite:///{tmp_path / 'catalog.db'}")  # the store is full, not the catalog
    model = make_mlp(tmp_path / "mlp.onnx", features=512, hidden=512)
    shown = dashboard_upload_error("mlp.onnx", model.read_bytes())
    assert "upload rejected" not in shown and "try again later" in shown and "No space left on device" in shown
    assert files_under(home / "tmp") == [] and files_under(home / "models") == []
    app = AppContext.from_settings(home, f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        with app.catalog.read() as session:
            assert session.exec(select(ModelRecord)).first() is None
    finally:
        app.close()


@pytest.mark.slow
def test_an_ort_build_that_cannot_write_its_engine_on_a_full_disk_is_retried(tmp_path: Path) -> None:
    """ONNX Runtime reports a full disk as "SaveToOrtFormat Failed" with no errno: the attempt is
    judged by the room left under its working folder, so the job is retried (and ends DEAD with the
    disk named once out of attempts), never FAILED on its first attempt as a bad input."""
    where = tmp_path / "disk"
    where.mkdir()
    mount("-t", "tmpfs", "-o", "size=8m", "tmpfs", str(where))
    try:
        home, catalog = where / "home", f"sqlite:///{tmp_path / 'catalog.db'}"
        model = make_mlp(tmp_path / "src" / "mlp.onnx", features=512, hidden=512)  # 2 MiB
        cli = [sys.executable, "-m", "enginecache.cli", "--home", str(home), "--db", catalog]
        subprocess.run([*cli, "model", "add", str(model), "--name", "mlp"], check=True, capture_output=True)
        fill(where, leave=512 * 1024)  # the build links the model (no copy): room for small files, not its engine
        done = subprocess.run([*cli, "build", "mlp", "--backend", "ort", "--json"], capture_output=True, text=True)
        assert done.returncode != 0
        app = AppContext.from_settings(home, catalog)
        try:
            [job] = list_jobs(app)
        finally:
            app.close()
        assert job.attempts == job.max_attempts > 1, (job.status, job.attempts, job.error)
        assert job.status == "DEAD" and "full" in (job.error or ""), job.error
    finally:
        subprocess.run(["umount", str(where)], check=True)
