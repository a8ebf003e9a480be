"""The memo's code identity (service.serving.memo.code_identity): every source file's relative path, size
and mtime, so an edit or an upgrade sends the next lookup down the full path."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.service.serving import memo


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "enginecache"
    (root / "service").mkdir(parents=True)
    (root / "__pycache__").mkdir()
    (root / "__init__.py").write_text("")
    (root / "service" / "builds.py").write_text("PLAN = 1\n")
    (root / "__pycache__" / "stale.py").write_text("")
    (root / "README.txt").write_text("not code")
    monkeypatch.setattr(memo, "PACKAGE_ROOT", root)
    memo.code_identity.cache_clear()
    yield root
    memo.code_identity.cache_clear()


def _fresh() -> str:
    memo.code_identity.cache_clear()
    return memo.code_identity()


def test_it_is_the_sources_relative_paths_sizes_and_mtimes(package: Path) -> None:
    expected = sorted(
        (path.relative_to(package).as_posix(), path.stat().st_size, path.stat().st_mtime_ns)
        for path in (package / "__init__.py", package / "service" / "builds.py")
    )
    assert memo.code_identity() == memo._digest(expected)


def test_an_edit_or_a_new_file_changes_it_and_caches_and_other_files_do_not(package: Path) -> None:
    before = _fresh()
    (package / "__pycache__" / "stale.py").write_text("x = 1\n")
    (package / "README.txt").write_text("still not code")
    assert _fresh() == before
    source = package / "service" / "builds.py"
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    edited = _fresh()
    assert edited != before
    (package / "service" / "lookup.py").write_text("")
    assert _fresh() not in (before, edited)
