"""Uploaded files to a model folder on disk: plain files written as given, archives extracted
safely (`archives`, whose docstring lists what an archive is refused for). Nothing here touches
the catalog or the store; the caller registers the `.onnx` found (and `register_model` validates
it before storing anything).

Everything is written into a private staging folder beside `dest` (`staging`), renamed to `dest`
only once the whole upload is in: a refusal or a failure removes the staging folder, so nothing
half-written is ever left or registered.

A disk full or failing while the upload is written raises `StoreError` (exit 3, "unavailable":
try again later), not a bad-input error; the partial output is removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from enginecache.dashboard.archives import (
    ARCHIVE_SUFFIXES,
    CENTRAL_DIRECTORY_BYTES_PER_ENTRY,
    MAX_ARCHIVE_ENTRIES,
    MAX_COMPRESSION_RATIO,
    RATIO_GRACE_BYTES,
    extract_archive,
    is_archive,
)
from enginecache.dashboard.staging import COPY_CHUNK, UploadedFile, remove_tree, staged, writing
from enginecache.errors import UploadError

__all__ = [
    "ARCHIVE_SUFFIXES",
    "CENTRAL_DIRECTORY_BYTES_PER_ENTRY",
    "MAX_ARCHIVE_ENTRIES",
    "MAX_COMPRESSION_RATIO",
    "RATIO_GRACE_BYTES",
    "UploadedFile",
    "extract_archive",
    "is_archive",
    "remove_tree",
    "stage_upload",
]


def _safe_name(name: str) -> str:
    """A plain file name (browsers send base names; anything with a path part is refused)."""
    base = name.replace("\\", "/")
    if not base or "/" in base or base in (".", "..") or base.startswith(".") or "\x00" in base:
        raise UploadError(f"refusing uploaded file name {name!r}: give a plain file name")
    return base


def stage_upload(
    files: Iterable[UploadedFile],
    dest: Path,
    *,
    max_extract_bytes: int,
    max_entries: int = MAX_ARCHIVE_ENTRIES,
    max_ratio: float = MAX_COMPRESSION_RATIO,
) -> Path:
    """Write the upload into `dest` (which must not exist yet) and return the path of its one `.onnx`.

    Either one archive (a model folder; its external data files beside the model), or one
    `.onnx` file plus its external data files. On any refusal or failure `dest` is not created.
    """
    items = list(files)
    if not items:
        raise UploadError("no file uploaded")
    archives = [f for f in items if is_archive(f.name)]
    if archives:
        if len(items) != 1:
            raise UploadError(
                f"upload either one archive or an .onnx with its data files, not {len(items)} files "
                f"with an archive ({archives[0].name})"
            )
        extract_archive(
            archives[0], dest, max_extract_bytes=max_extract_bytes, max_entries=max_entries, max_ratio=max_ratio
        )
        return _one_model(dest, f"archive {archives[0].name}")
    names = [_safe_name(item.name) for item in items]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UploadError(f"file {name!r} uploaded twice")
        seen.add(name)
    with staged(dest, "the upload") as staging:
        for item, name in zip(items, names, strict=True):
            with writing("the upload", name, staging), open(staging / name, "xb") as out:
                shutil.copyfileobj(item.stream, out, COPY_CHUNK)
    return _one_model(dest, "the upload")


def _one_model(folder: Path, what: str) -> Path:
    models = sorted(p for p in folder.rglob("*.onnx") if p.is_file())
    if not models:
        raise UploadError(f"{what} holds no .onnx file")
    if len(models) > 1:
        names = ", ".join(p.relative_to(folder).as_posix() for p in models[:5])
        raise UploadError(f"{what} holds {len(models)} .onnx files ({names}); upload one model at a time")
    return models[0]
