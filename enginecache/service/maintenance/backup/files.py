"""Files for backup and restore: a copy hashed as it is written, model bundle digests and file paths,
safe relative paths, publishing a complete folder by a rename, and removing a half-made one.

A copy (`core.hashing.copy_hashed`, durable) reads each byte once, writes it and hashes it (sha256
and BLAKE3 over the same chunks), then fsyncs the copy: the digest it returns is of the bytes that were
written, so the caller compares it with the one recorded before anything relies on the copy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from enginecache.core import hashing
from enginecache.core.hashing import DigestResult
from enginecache.core.store import fsync_dir
from enginecache.errors import BackupRefusedError, IntegrityCheckError

logger = logging.getLogger(__name__)


def copy_hashed(source: Path, dest: Path) -> DigestResult:
    """Copy `source` to the new file `dest` (never replacing one), hashing the bytes written; fsync
    the copy and keep the source's permission bits. A missing source raises FileNotFoundError
    before `dest` is made."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return hashing.copy_hashed(source, dest, durable=True)


def bundle_digest(model_file: str, files: dict[str, DigestResult]) -> str:
    """A model's digest from the digests of its bundle's files (`files`: relative name -> digest,
    the model file's under `model_file`), by the rule of `core.onnx_info.model_digest`: the model
    file's sha256 alone, or the sha256 of the bundle listing when there is external data."""
    from enginecache.core.onnx_info import BUNDLE_HEADER

    model = files[model_file]
    external = sorted(name for name in files if name != model_file)
    if not external:
        return model.sha256
    bundle = hashlib.sha256(BUNDLE_HEADER.encode("utf-8"))
    bundle.update(f"{PurePosixPath(model_file).name}\t{model.size}\t{model.sha256}\n".encode())
    for name in external:
        bundle.update(f"{name}\t{files[name].size}\t{files[name].sha256}\n".encode())
    return bundle.hexdigest()


def safe_relative(name: str, what: str) -> PurePosixPath:
    """`name` as a relative POSIX path that stays where it is joined (no absolute path, no `..`, no
    empty part); IntegrityCheckError naming `what` otherwise."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise IntegrityCheckError(f"{what}: unsafe relative path {name!r}")
    return path


def bundle_file(digest: str, name: str, what: str) -> str:
    """Where the file `name` of the model bundle `digest` lies under a home or a backup:
    `models/<digest>/<name>`, `name` checked by `safe_relative` (IntegrityCheckError naming `what`)."""
    return f"models/{digest}/{safe_relative(name, what)}"


def fsync_tree(root: Path) -> None:
    """fsync every directory under `root` (and `root`), deepest first, so the names of the files
    copied into them are durable before the folder is published by a rename."""
    folders = [Path(dirpath) for dirpath, _dirs, _files in os.walk(root)]
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(folder)


def publish_folder(work: Path, dest: Path, refusal: Callable[[OSError], str]) -> None:
    """Rename the complete folder `work` to `dest` and fsync `dest`'s parent, so that `dest` appears
    whole or not at all; where the rename fails (`dest` appeared meanwhile), BackupRefusedError
    with the words `refusal` gives for the OS's error."""
    try:
        os.rename(work, dest)
    except OSError as err:
        raise BackupRefusedError(refusal(err)) from err
    fsync_dir(dest.parent)


def remove_tree(path: Path) -> None:
    """Remove a folder this module made (a half-made backup or restore); what cannot be removed is
    logged, not raised, so the error that led here is the one the caller sees."""

    def warn(_function: object, failed: str, exc_info: object) -> None:
        logger.warning("could not remove %s: %s", failed, exc_info)

    if path.exists():
        shutil.rmtree(path, onerror=warn)


def is_empty_dir(path: Path) -> bool:
    """Whether `path` is absent or an empty directory."""
    if not path.exists():
        return True
    return path.is_dir() and next(iter(path.iterdir()), None) is None
