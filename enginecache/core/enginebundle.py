"""An engine bundle: an engine of several files (TensorRT-LLM's directory: `config.json` plus one
`rank<N>.engine` per tensor/pipeline rank, with extra files such as a tokenizer beside them), stored
as one engine whose blob is its manifest.

The manifest is canonical JSON (sorted keys, no spaces, files sorted by path) listing each file's
relative POSIX path, size, sha256, BLAKE3 and chunk BLAKE3 digests; the bytes are the engine's blob,
so the engine's identity is the manifest's sha256 and each file is its own content-addressed blob.

A path in a manifest is relative, has no empty, `.` or `..` part, no backslash and no NUL; a folder
scanned for a bundle has only regular files and folders (a symlink anywhere is refused), at least
one `rank<N>.engine` and its `config.json`. Every refusal is BundleError naming the path and why.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from enginecache.core.blobpaths import is_digest
from enginecache.core.hashing import hash_file
from enginecache.errors import BadInputError, IntegrityCheckError

FORMAT = "enginecache.bundle/1"
CONFIG_NAME = "config.json"
RANK_FILE = re.compile(r"^rank(\d+)\.engine$")
MAX_FILES = 4096


class BundleError(BadInputError):
    """A folder or manifest that is no valid engine bundle; the message names the path and why."""


@dataclass(frozen=True)
class BundleFile:
    """One file of a bundle, as its manifest lists it."""

    path: str  # relative POSIX path inside the bundle
    size: int
    sha256: str
    blake3: str
    chunk_blake3: str = ""  # core.chunkdigests' encoding ("" for one chunk or less)

    @property
    def rank(self) -> int | None:
        """N for a top-level `rank<N>.engine`, else None."""
        found = RANK_FILE.match(self.path)
        return int(found.group(1)) if found else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "sha256": self.sha256,
            "blake3": self.blake3,
            "chunk_blake3": self.chunk_blake3,
        }


@dataclass(frozen=True)
class BundleManifest:
    """The files of one bundle, sorted by path."""

    files: tuple[BundleFile, ...]

    def __post_init__(self) -> None:
        check_files(self.files)

    @property
    def ranks(self) -> tuple[BundleFile, ...]:
        """The rank engines, by rank."""
        return tuple(sorted((f for f in self.files if f.rank is not None), key=lambda f: f.rank or 0))

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def file(self, path: str) -> BundleFile:
        """The file at `path`; BundleError naming the paths there are where there is none."""
        for entry in self.files:
            if entry.path == path:
                return entry
        raise BundleError(f"the bundle has no file {path!r}; it has {', '.join(f.path for f in self.files)}")

    def to_bytes(self) -> bytes:
        """The canonical JSON whose sha256 is the engine's identity."""
        body = {"format": FORMAT, "files": [f.to_dict() for f in sorted(self.files, key=lambda f: f.path)]}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def check_path(text: str) -> str:
    """`text` as a bundle's relative POSIX path; BundleError for an absolute path, an empty, `.` or
    `..` part, a backslash or a NUL."""
    if not isinstance(text, str) or not text:
        raise BundleError(f"a bundle path must be a non-empty string, not {text!r}")
    if "\\" in text or "\0" in text:
        raise BundleError(f"bundle path {text!r} has a backslash or NUL")
    if text.startswith("/") or PurePosixPath(text).is_absolute():
        raise BundleError(f"bundle path {text!r} is absolute; paths are relative to the bundle's folder")
    parts = text.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise BundleError(f"bundle path {text!r} has an empty, '.' or '..' part")
    return text


def check_files(files: Iterable[BundleFile]) -> None:
    """BundleError unless the files have valid, distinct paths, digests and sizes, a config.json and
    at least one rank<N>.engine, with no file inside another's path."""
    seen: set[str] = set()
    listed = list(files)
    if len(listed) > MAX_FILES:
        raise BundleError(f"a bundle has at most {MAX_FILES} files, not {len(listed)}")
    for entry in listed:
        check_path(entry.path)
        if entry.path in seen:
            raise BundleError(f"bundle path {entry.path!r} is listed twice")
        seen.add(entry.path)
        if not is_digest(entry.sha256) or not isinstance(entry.size, int) or entry.size < 0:
            raise BundleError(f"bundle file {entry.path!r} has no valid sha256 and size")
    for path in seen:
        parents = PurePosixPath(path).parents
        clash = next((str(p) for p in parents if str(p) in seen), None)
        if clash is not None:
            raise BundleError(f"bundle path {path!r} lies under {clash!r}, which is a file")
    if CONFIG_NAME not in seen:
        raise BundleError(f"a bundle needs its {CONFIG_NAME} at the top of the folder")
    if not any(RANK_FILE.match(p) for p in seen):
        raise BundleError("a bundle needs at least one rank<N>.engine at the top of the folder")


def parse_manifest(data: bytes) -> BundleManifest:
    """The manifest in `data`; BundleError for anything that is not a valid one (checked as
    `check_files` says)."""
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BundleError(f"not a bundle manifest: {err}") from err
    if not isinstance(body, dict) or body.get("format") != FORMAT or not isinstance(body.get("files"), list):
        raise BundleError(f"not a bundle manifest (format {FORMAT})")
    files = []
    for item in body["files"]:
        if not isinstance(item, dict):
            raise BundleError("a bundle manifest's file entry is not an object")
        try:
            files.append(
                BundleFile(
                    path=item["path"],
                    size=item["size"],
                    sha256=item["sha256"],
                    blake3=item["blake3"],
                    chunk_blake3=item.get("chunk_blake3") or "",
                )
            )
        except KeyError as err:
            raise BundleError(f"a bundle manifest's file entry lacks {err}") from err
    return BundleManifest(tuple(sorted(files, key=lambda f: f.path)))


def is_manifest(data: bytes) -> bool:
    """Whether `data` starts as a bundle manifest does (a cheap test; `parse_manifest` checks it)."""
    return data.lstrip()[:1] == b"{" and FORMAT.encode() in data[:4096]


def scan_folder(root: Path) -> list[tuple[str, Path]]:
    """The files under `root` as (relative POSIX path, absolute path), sorted by path. BundleError
    where `root` is no folder, where anything under it is a symlink or neither a regular file nor a
    folder, or where the layout lacks config.json or a rank<N>.engine."""
    try:
        top = os.lstat(root)
    except OSError as err:
        raise BundleError(f"bundle folder {root}: {err.strerror}") from err
    if not stat.S_ISDIR(top.st_mode):
        raise BundleError(f"{root} is not a folder")
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in [*dirs, *names]:
            full = Path(folder) / name
            relative = full.relative_to(root).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                raise BundleError(f"{relative} in bundle folder {root} is a symlink; a bundle holds only files")
            if stat.S_ISREG(mode):
                found.append((check_path(relative), full))
            elif not stat.S_ISDIR(mode):
                raise BundleError(f"{relative} in bundle folder {root} is not a regular file")
    found.sort()
    present = {relative for relative, _ in found}
    if CONFIG_NAME not in present:
        raise BundleError(f"bundle folder {root} has no {CONFIG_NAME}")
    if not any(RANK_FILE.match(relative) for relative in present):
        raise BundleError(f"bundle folder {root} has no rank<N>.engine")
    if len(found) > MAX_FILES:
        raise BundleError(f"bundle folder {root} has {len(found)} files; at most {MAX_FILES}")
    return found


def check_entry(path: Path, entry: BundleFile, label: str) -> None:
    """IntegrityCheckError (naming `label` and the file) unless `path` matches `entry`."""
    got = hash_file(path)
    if got.size != entry.size or got.sha256 != entry.sha256 or got.blake3 != entry.blake3:
        raise IntegrityCheckError(
            f"{label}: {entry.path} hashes to sha256 {got.sha256} ({got.size} B), "
            f"its manifest says {entry.sha256} ({entry.size} B)"
        )


def folder_matches(folder: Path, manifest: BundleManifest, label: str) -> None:
    """IntegrityCheckError unless `folder` holds exactly `manifest`'s files, each matching it;
    BundleError where it holds a symlink or anything but files and folders."""
    listed = sorted(rel for rel, _ in scan_folder(folder))
    if listed != sorted(f.path for f in manifest.files):
        raise IntegrityCheckError(f"{label}: {folder} does not hold exactly the bundle's files")
    for entry in manifest.files:
        check_entry(folder / entry.path, entry, label)


def bundle_blobs(provenance: dict[str, Any] | None) -> set[str]:
    """The digests of a bundle's files its engine's `provenance` lists (`provenance["bundle"]["blobs"]`;
    empty for an engine of one file)."""
    bundle = (provenance or {}).get("bundle") or {}
    return {str(d) for d in bundle.get("blobs") or ()}
