"""Uploaded files to a model folder on disk: plain files written as given, archives extracted
safely. Nothing here touches the catalog or the store; the caller registers the `.onnx` found
(and `register_model` validates it before storing anything).

Archive members are rejected when absolute, containing `..`, links or devices, or when their
total size passes the limit; the error names the member.
"""

from __future__ import annotations

import functools
import shutil
import tarfile
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

from enginecache.errors import UploadError

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
COPY_CHUNK = 1 << 20


@dataclass(frozen=True)
class UploadedFile:
    """One uploaded file: its name as the browser sent it and a readable stream."""

    name: str
    stream: BinaryIO
    size: int


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _safe_name(name: str) -> str:
    """A plain file name (browsers send base names; anything with a path part is refused)."""
    base = name.replace("\\", "/")
    if not base or "/" in base or base in (".", "..") or base.startswith("."):
        raise UploadError(f"refusing uploaded file name {name!r}: give a plain file name")
    return base


def stage_upload(files: Iterable[UploadedFile], dest: Path, *, max_extract_bytes: int) -> Path:
    """Write the upload into `dest` and return the path of its one `.onnx` model.

    Either one archive (a model folder; its external data files beside the model), or one
    `.onnx` file plus its external data files.
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
        extract_archive(archives[0], dest, max_extract_bytes=max_extract_bytes)
        return _one_model(dest, f"archive {archives[0].name}")
    dest.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    for item in items:
        name = _safe_name(item.name)
        if name in seen:
            raise UploadError(f"file {name!r} uploaded twice")
        seen.add(name)
        with open(dest / name, "wb") as out:
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


def _check_member(name: str, what: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UploadError(f"{what}: member {name!r} has an absolute path")
    if ".." in path.parts:
        raise UploadError(f"{what}: member {name!r} climbs out of the folder with '..'")
    return path


def extract_archive(upload: UploadedFile, dest: Path, *, max_extract_bytes: int) -> None:
    """Extract a zip or tar into `dest`, refusing unsafe members and oversize content."""
    name = upload.name.lower()
    what = f"archive {upload.name}"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if name.endswith(".zip"):
            _extract_zip(upload.stream, dest, what, max_extract_bytes)
        else:
            _extract_tar(upload.stream, dest, what, max_extract_bytes)
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as err:
        raise UploadError(f"{what} cannot be read: {err}") from err


@dataclass(frozen=True)
class ArchiveMember:
    """One archive entry as both archive formats describe it: name, declared size, what it is, and
    how to open its bytes."""

    name: str
    size: int
    kind: str  # "file" | "dir" | "link" | "other"
    open: Callable[[], IO[bytes] | None]


def _zip_members(archive: zipfile.ZipFile) -> list[ArchiveMember]:
    def kind(info: zipfile.ZipInfo) -> str:
        if (info.external_attr >> 16) & 0o170000 == 0o120000:
            return "link"
        return "dir" if info.is_dir() else "file"

    return [
        ArchiveMember(info.filename, info.file_size, kind(info), functools.partial(archive.open, info))
        for info in archive.infolist()
    ]


def _tar_members(archive: tarfile.TarFile) -> list[ArchiveMember]:
    def kind(member: tarfile.TarInfo) -> str:
        if member.issym() or member.islnk():
            return "link"
        return "file" if member.isfile() else "dir" if member.isdir() else "other"

    return [
        ArchiveMember(m.name, m.size, kind(m), functools.partial(archive.extractfile, m)) for m in archive.getmembers()
    ]


def _extract_zip(stream: BinaryIO, dest: Path, what: str, limit: int) -> None:
    with zipfile.ZipFile(stream) as archive:
        _extract_members(_zip_members(archive), dest, what, limit)


def _extract_tar(stream: BinaryIO, dest: Path, what: str, limit: int) -> None:
    with tarfile.open(fileobj=stream, mode="r:*") as archive:
        _extract_members(_tar_members(archive), dest, what, limit)


def _extract_members(members: list[ArchiveMember], dest: Path, what: str, limit: int) -> None:
    """Check every member before writing any (paths, links, devices, the size limit), then write."""
    total = 0
    for member in members:
        _check_member(member.name, what)
        if member.kind == "link":
            raise UploadError(f"{what}: member {member.name!r} is a link")
        if member.kind == "other":
            raise UploadError(f"{what}: member {member.name!r} is not a regular file or folder")
        total += member.size
        if total > limit:
            raise UploadError(f"{what} expands past the limit of {limit:,d} bytes")
    for member in members:
        target = dest / _check_member(member.name, what)
        if member.kind == "dir":
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        source = member.open()
        if source is None:
            raise UploadError(f"{what}: member {member.name!r} cannot be read")
        with source, open(target, "wb") as out:
            _copy_limited(source, out, member.size, what, member.name)


def _copy_limited(source: IO[bytes], out: IO[bytes], declared: int, what: str, member: str) -> None:
    """Copy at most the member's declared size (a lying header cannot write more)."""
    written = 0
    while chunk := source.read(COPY_CHUNK):
        written += len(chunk)
        if written > declared:
            raise UploadError(f"{what}: member {member!r} is larger than its header says")
        out.write(chunk)
