"""Archives (zip, tar, compressed tars) extracted safely into a folder.

An archive is read as a stream, member by member, and what it holds is counted as it comes out,
never taken from its headers. It is refused (`UploadError`, naming the limit or the rule and the
member) when:

- a member has an absolute path, climbs out with ``..``, names nothing, or is a link (symbolic or
  hard), a device, a FIFO or anything else that is not a regular file or a folder;
- two members name the same path (a duplicate would otherwise silently win over the first), or
  paths that differ only in case or Unicode normalisation (``a.onnx`` and ``A.onnx``, ``x/y`` and
  ``X/y``: one file on a case-insensitive file system), or a path is both a file and a folder;
- it has more than `MAX_ARCHIVE_ENTRIES` entries (10,000), counted as they are read; a zip's central
  directory, which `zipfile` reads whole before the first member, is first bounded by its size
  (`CENTRAL_DIRECTORY_BYTES_PER_ENTRY` per allowed entry);
- more than `max_extract_bytes` come out (the dashboard passes ``ENGINECACHE_MAX_EXTRACT_MB``,
  default four times the upload limit), counted as the bytes are written; a zip whose headers
  declare more is refused before anything is written, and a member larger than its header says
  is cut off with an error;
- more than `MAX_COMPRESSION_RATIO` (100) times the archive's own size comes out, once past
  `RATIO_GRACE_BYTES` (16 MiB): a decompression bomb (1 GiB of zeros is about 1 MiB zipped, 859
  bytes as a tar.bz2). Real ONNX weights compress by 10% or so; a model of mostly zeros can be
  uploaded as a plain `.tar` or as its files;
- a zip member is compressed with anything but deflate (or stored): `zipfile` decompresses bzip2
  and lzma members without bounding what one read produces. Compressed tars are read through
  gzip/bz2/lzma file objects, which do bound it.

A member's output goes into a staging folder (`staging.staged`): on a refusal or a failure the
destination is not created.
"""

from __future__ import annotations

import os
import struct
import tarfile
import unicodedata
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

from enginecache.dashboard.staging import COPY_CHUNK, UploadedFile, staged, writing
from enginecache.errors import UploadError

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
MAX_ARCHIVE_ENTRIES = 10_000  # files and folders, as many as an archive may hold
MAX_COMPRESSION_RATIO = 100  # bytes out per byte of archive, past RATIO_GRACE_BYTES
RATIO_GRACE_BYTES = 16 << 20  # what any archive may expand to, whatever its ratio
CENTRAL_DIRECTORY_BYTES_PER_ENTRY = 1024  # a zip's central directory may hold this much per allowed entry


# How deep a member may lie: deeper paths are refused before any folder is made (an archive named a
# member 2,000 folders deep, which the folder creation met with a RecursionError).
MAX_MEMBER_DEPTH = 64


def is_archive(name: str) -> bool:
    return name.lower().endswith(ARCHIVE_SUFFIXES)


def _check_member(name: str, what: str) -> PurePosixPath:
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UploadError(f"{what}: member {name!r} has an absolute path")
    if ".." in path.parts:
        raise UploadError(f"{what}: member {name!r} climbs out of the folder with '..'")
    if "\x00" in name:
        raise UploadError(f"{what}: member {name!r} has a NUL byte in its name")
    if len(path.parts) > MAX_MEMBER_DEPTH:
        shown = name if len(name) <= 80 else f"{name[:40]}...{name[-30:]}"
        raise UploadError(
            f"{what}: member {shown!r} is {len(path.parts)} folders deep (at most {MAX_MEMBER_DEPTH}): "
            "a model's files are never nested that far"
        )
    return path


def extract_archive(
    upload: UploadedFile,
    dest: Path,
    *,
    max_extract_bytes: int,
    max_entries: int = MAX_ARCHIVE_ENTRIES,
    max_ratio: float = MAX_COMPRESSION_RATIO,
) -> None:
    """Extract a zip or tar into `dest` (which must not exist yet), refusing unsafe members and
    anything past the limits (module docstring); on a refusal or a failure `dest` is not created."""
    name = upload.name.lower()
    what = f"archive {upload.name}"
    budget = _Budget(what, _stream_size(upload), max_extract_bytes, max_entries, max_ratio)
    with staged(dest, what) as staging:
        try:
            if name.endswith(".zip"):
                _extract_zip(upload.stream, staging, what, budget)
            else:
                _extract_tar(upload.stream, staging, what, budget)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, tarfile.TarError, EOFError, NotImplementedError) as err:
            raise UploadError(f"{what} cannot be read: {err}") from err


def _stream_size(upload: UploadedFile) -> int:
    """The archive's own size in bytes: the stream's length where it can seek, else the upload's size."""
    stream = upload.stream
    if not stream.seekable():
        return upload.size
    here = stream.tell()
    end = stream.seek(0, os.SEEK_END)
    stream.seek(here)
    return end - here


class _Budget:
    """What an archive has given so far (entries, bytes written), against its limits."""

    def __init__(self, what: str, archive_bytes: int, max_bytes: int, max_entries: int, max_ratio: float) -> None:
        self.what = what
        self.archive_bytes = archive_bytes
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self.max_ratio = max_ratio
        self.ratio_cap = max(RATIO_GRACE_BYTES, int(max_ratio * archive_bytes))
        self.entries = 0
        self.written = 0

    def entry(self, member: str) -> None:
        self.entries += 1
        if self.entries > self.max_entries:
            raise UploadError(
                f"{self.what} has more than {self.max_entries:,d} entries (the entry limit), "
                f"refused at member {member!r}"
            )

    def wrote(self, nbytes: int, member: str) -> None:
        self.written += nbytes
        if self.written > self.max_bytes:
            raise UploadError(
                f"{self.what} expands past the limit of {self.max_bytes:,d} bytes "
                f"(ENGINECACHE_MAX_EXTRACT_MB), refused at member {member!r}"
            )
        if self.written > self.ratio_cap:
            raise UploadError(
                f"{self.what} expands past {self.max_ratio:g} times its own {self.archive_bytes:,d} bytes "
                f"(the compression ratio limit), refused at member {member!r}: a decompression bomb?"
            )


@dataclass
class _Member:
    """One archive entry as both archive formats describe it: name, declared size, what it is."""

    name: str
    size: int
    kind: str  # "file" | "dir" | "link" | "other"


def _name_key(path: str) -> str:
    """What two names must not share: one file on a case-insensitive, normalising file system."""
    return unicodedata.normalize("NFC", path).casefold()


class _Names:
    """The paths an archive has named so far: refuses duplicates, case collisions, a path that is
    both a file and a folder, and members inside a file."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.seen: dict[str, tuple[str, str]] = {}  # key -> (path as spelled, "file" | "dir" | "implied")

    def add(self, member: _Member) -> PurePosixPath:
        path = _check_member(member.name, self.what)
        if member.kind == "link":
            raise UploadError(f"{self.what}: member {member.name!r} is a link")
        if member.kind == "other":
            raise UploadError(f"{self.what}: member {member.name!r} is not a regular file or folder")
        parts = path.parts
        if not parts:  # "." or "./": the archive's own top folder (`tar -cf x.tar .` writes one)
            if member.kind != "dir":
                raise UploadError(f"{self.what}: member {member.name!r} names no file")
            return path
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            known = self.seen.get(_name_key(folder))
            if known is None:
                self.seen[_name_key(folder)] = (folder, "implied")
            elif known[1] == "file":
                raise UploadError(f"{self.what}: member {member.name!r} is inside {known[0]!r}, which is a file")
            elif known[0] != folder:
                raise self._collision(member.name, folder, known[0])
        spelled = "/".join(parts)
        known = self.seen.get(_name_key(spelled))
        if known is not None:
            if known[0] != spelled:
                raise self._collision(member.name, spelled, known[0])
            if known[1] == member.kind:
                raise UploadError(f"{self.what}: member {member.name!r} appears twice (duplicate members)")
            if not (known[1] == "implied" and member.kind == "dir"):
                raise UploadError(f"{self.what}: member {member.name!r} names both a file and a folder")
        self.seen[_name_key(spelled)] = (spelled, member.kind)
        return path

    def _collision(self, member: str, path: str, other: str) -> UploadError:
        return UploadError(
            f"{self.what}: member {member!r} names {path!r}, which differs from {other!r} only in case "
            "(or Unicode normalisation): one file on a case-insensitive file system"
        )


def _write(source: IO[bytes], target: Path, member: _Member, what: str, budget: _Budget) -> None:
    """Copy one member's bytes, counting each chunk against the limits, at most its declared size."""
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(target, "xb") as out:
        while chunk := source.read(COPY_CHUNK):
            written += len(chunk)
            if written > member.size:
                raise UploadError(f"{what}: member {member.name!r} is larger than its header says")
            budget.wrote(len(chunk), member.name)
            out.write(chunk)


# -- zip ------------------------------------------------------------------------------------

_EOCD = struct.Struct("<4s4H2LH")  # end of central directory record
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")


def _central_directory_size(stream: BinaryIO) -> int | None:
    """The size a zip's end records give its central directory (what `zipfile` will read and parse
    before anything else), or None where there is no end record (zipfile then says it is no zip)."""
    end = stream.seek(0, os.SEEK_END)
    tail_start = max(0, end - (_EOCD.size + 0xFFFF))
    stream.seek(tail_start)
    tail = stream.read()
    stream.seek(0)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _EOCD.size:
        return None
    size = int(_EOCD.unpack_from(tail, at)[6])
    if size != 0xFFFFFFFF:
        return size
    locator = at - _EOCD64_LOCATOR.size
    record = locator - _EOCD64.size
    if record < 0 or tail[locator : locator + 4] != b"PK\x06\x07" or tail[record : record + 4] != b"PK\x06\x06":
        return size
    return int(_EOCD64.unpack_from(tail, record)[8])


# Compression methods whose members zipfile decompresses a bounded buffer at a time; it hands a bzip2
# or lzma member's compressed bytes to the decompressor unbounded (a memory bomb).
_BOUNDED_METHODS = frozenset({zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED})


def _zip_member(info: zipfile.ZipInfo, what: str) -> _Member:
    if info.compress_type not in _BOUNDED_METHODS and not info.is_dir():
        raise UploadError(
            f"{what}: member {info.filename!r} uses compression method {info.compress_type}; "
            "only stored and deflated members are accepted"
        )
    mode = (info.external_attr >> 16) & 0o170000
    if mode == 0o120000:
        kind = "link"
    elif info.is_dir():
        kind = "dir"
    elif mode in (0, 0o100000):
        kind = "file"
    else:
        kind = "other"
    return _Member(info.filename, info.file_size, kind)


def _extract_zip(stream: BinaryIO, dest: Path, what: str, budget: _Budget) -> None:
    """Bound the central directory, check every member's name and kind and the declared total
    (nothing written yet), then write the members one by one, counting what comes out."""
    directory = _central_directory_size(stream)
    cap = budget.max_entries * CENTRAL_DIRECTORY_BYTES_PER_ENTRY
    if directory is not None and directory > cap:
        raise UploadError(
            f"{what}: its central directory is {directory:,d} bytes, more than {budget.max_entries:,d} entries "
            f"(the entry limit) could need ({cap:,d} bytes); no member was read"
        )
    with zipfile.ZipFile(stream) as archive:
        names = _Names(what)
        planned: list[tuple[zipfile.ZipInfo, _Member, PurePosixPath]] = []
        declared = 0
        for info in archive.infolist():
            budget.entry(info.filename)
            member = _zip_member(info, what)
            planned.append((info, member, names.add(member)))
            declared += member.size
            if declared > budget.max_bytes:
                raise UploadError(
                    f"{what} declares more than the limit of {budget.max_bytes:,d} bytes "
                    f"(ENGINECACHE_MAX_EXTRACT_MB), refused at member {info.filename!r}"
                )
        for info, member, path in planned:
            target = dest / path
            with writing(what, member.name, dest):
                if member.kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                with archive.open(info) as source:
                    _write(source, target, member, what, budget)


# -- tar ------------------------------------------------------------------------------------


def _tar_member(member: tarfile.TarInfo) -> _Member:
    if member.issym() or member.islnk():
        kind = "link"
    else:
        kind = "file" if member.isfile() else "dir" if member.isdir() else "other"
    return _Member(member.name, member.size, kind)


def _extract_tar(stream: BinaryIO, dest: Path, what: str, budget: _Budget) -> None:
    """One pass over the (possibly compressed) stream: each member is counted, checked and written
    as it is read; a refusal part way removes what was written (`_staged`).

    Mode "r:*", not the stream mode "r|*": the stream mode hands the decompressor the compressed
    bytes with no bound on what comes out (a bz2 of 1 GiB of zeros is 859 bytes, all of it
    decompressed into memory at the first header), while gzip, bz2 and lzma files decompress a
    bounded buffer at a time. Members are read in order, so it is still one forward pass."""
    names = _Names(what)
    with tarfile.open(fileobj=stream, mode="r:*") as archive:
        for info in archive:
            budget.entry(info.name)
            member = _tar_member(info)
            target = dest / names.add(member)
            with writing(what, member.name, dest):
                if member.kind == "dir":
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                source = archive.extractfile(info)
                if source is None:
                    raise UploadError(f"{what}: member {member.name!r} cannot be read")
                with source:
                    _write(source, target, member, what, budget)
