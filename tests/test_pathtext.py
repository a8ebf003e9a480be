"""core.pathtext gives the strings pathlib gives (the stat cache's key must be the same on both load
paths), and the hit path opens a catalog whose path holds the characters SQLite's URIs give a meaning to."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from enginecache.core.blobpaths import blob_file, blob_path
from enginecache.core.pathtext import absolute_text, resolved_text
from enginecache.db.catalogfile import sqlite_file_uri
from enginecache.errors import IntegrityCheckError

WRITTEN = [
    "model.onnx",
    "./model.onnx",
    "a//b/./c/",
    "a/../b",
    "../up.onnx",
    ".",
    "",
    "/abs/./x//y/",
    "//share/x",
    "///three/x",
    "/a/b/..",
    "dir with spaces/ünï.onnx",
]


@pytest.mark.parametrize("written", WRITTEN)
@pytest.mark.parametrize("cwd", ["tmp", "/"])
def test_absolute_text_is_what_pathlib_writes(
    written: str, cwd: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path if cwd == "tmp" else cwd)
    assert absolute_text(written) == str(Path(written).absolute())
    assert absolute_text(Path(written)) == str(Path(written).absolute())


def test_absolute_text_refuses_bytes() -> None:
    with pytest.raises(TypeError, match="str path"):
        absolute_text(b"model.onnx")  # type: ignore[arg-type]


def test_resolved_text_is_what_pathlib_resolves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for written in ["link", "link/../real//x", "~/link/missing", "./real/", str(tmp_path / "link" / "y")]:
        assert resolved_text(written) == str(Path(written).expanduser().resolve()), written


def test_blob_file_is_blob_path_as_a_string(tmp_path: Path) -> None:
    digest = "ab" + "0" * 62
    assert blob_file(str(tmp_path), digest) == str(blob_path(tmp_path, digest))
    assert blob_file(tmp_path, digest) == str(blob_path(tmp_path, digest))
    for bad in (None, "AB" + "0" * 62, "../" + "0" * 61):
        with pytest.raises(IntegrityCheckError, match="not a sha256 digest"):
            blob_file(str(tmp_path), bad)


@pytest.mark.parametrize("name", ["plain", "100% sure", "what?mode=ro", "no#fragment", "%3f"])
def test_the_hit_paths_sqlite_uri_opens_that_file_and_no_other(tmp_path: Path, name: str) -> None:
    folder = tmp_path / name
    folder.mkdir()
    path = folder / "catalog.db"
    with sqlite3.connect(path) as made:
        made.execute("CREATE TABLE marker (name TEXT)")
        made.execute("INSERT INTO marker VALUES (?)", (name,))
    made.close()
    connection = sqlite3.connect(sqlite_file_uri(str(path)), uri=True)
    try:
        assert connection.execute("SELECT name FROM marker").fetchone() == (name,)
        connection.execute("INSERT INTO marker VALUES ('written')")  # mode=rw: writable
        connection.commit()
    finally:
        connection.close()
    assert sorted(os.listdir(folder)) == ["catalog.db"], "no other file was created"
    with pytest.raises(sqlite3.OperationalError):  # mode=rw never creates a catalog
        sqlite3.connect(sqlite_file_uri(str(folder / "missing.db")), uri=True).execute("SELECT 1")


def test_a_relative_catalog_path_stays_relative(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sqlite3.connect("rel.db").close()
    assert sqlite_file_uri("rel.db") == "file:rel.db?mode=rw"
    sqlite3.connect(sqlite_file_uri("rel.db"), uri=True).execute("SELECT 1").close()
