"""Helpers of the bounded-input tests (tests/test_bounded_*.py): archives made in memory and
uploaded, a dashboard upload's error, mounts (root only; skipped with the reason elsewhere, failing
under CI=true), and whether anything was stored or extracted."""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from sqlmodel import select

from enginecache.dashboard.uploads import UploadedFile
from enginecache.db.models import ModelRecord
from enginecache.service.context import AppContext
from tests.conftest import files_under, skip_or_fail
from tests.dashboardkit import view
from tests.test_dashboard_views import plain

GIB = 1 << 30


def nothing_stored(app: AppContext) -> bool:
    with app.catalog.read() as session:
        none_recorded = session.exec(select(ModelRecord)).first() is None
    return none_recorded and files_under(app.home / "models") == [] and files_under(app.home / "tmp") == []


def mount(*args: str) -> None:
    if shutil.which("mount") is None:
        skip_or_fail("no mount command on this host")
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        skip_or_fail(f"mount {' '.join(args)} is not permitted here: {done.stderr.strip()}")


def tar_of(members: list[tuple[str, bytes | None]], mode: str = "w") -> bytes:
    """A tar (`mode` "w", "w:gz", ...) of files (bytes) and folders (None), in this order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def zip_of(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, payload in members:
            archive.writestr(name, payload)
    return buffer.getvalue()


def upload(name: str, content: bytes) -> UploadedFile:
    return UploadedFile(name, io.BytesIO(content), len(content))


def assert_nothing_extracted(dest: Path) -> None:
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == [], "a staging folder was left behind"


def dashboard_upload_error(name: str, content: bytes) -> str:
    """Upload `content` as `name` in the dashboard's Models view and submit it: the one error it
    shows, as plain text."""
    at = view("models").run()
    at.get("file_uploader")[0].upload(name, content).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    assert len(at.error) == 1
    return plain(at.error[0].value)
