"""Copying a backup's files into the folder a restore fills, each checked against the manifest as it
is copied (sha256 and size; a model bundle also against its model digest), and checking a file in
place the same way (PostgreSQL's dump, which pg_restore reads where it is)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from enginecache.core.blobpaths import is_digest
from enginecache.core.hashing import DigestResult, hash_file
from enginecache.core.store import ArtifactStore
from enginecache.errors import IntegrityCheckError
from enginecache.service.maintenance.backup.files import bundle_digest, bundle_file, copy_hashed


def restore_verified(source: Path, dest: Path, sha256: str, size: int, what: str) -> DigestResult:
    """Copy the backup's `source` to the new file `dest`, checked against the manifest's digest."""
    return _checked(lambda: copy_hashed(source, dest), source, sha256, size, what)


def verify_in_place(source: Path, sha256: str, size: int, what: str) -> DigestResult:
    """Check the backup's `source` against the manifest's digest without copying it."""
    return _checked(lambda: hash_file(source), source, sha256, size, what)


def _checked(digest: Callable[[], DigestResult], path: Path, sha256: str, size: int, what: str) -> DigestResult:
    try:
        got = digest()
    except FileNotFoundError as err:
        raise IntegrityCheckError(f"{what} {path} is missing from the backup") from err
    if got.sha256 != sha256 or got.size != size:
        raise IntegrityCheckError(
            f"{what} {path} is damaged: sha256 {got.sha256} ({got.size} bytes), "
            f"the manifest records {sha256} ({size} bytes)"
        )
    return got


def restore_files(
    store: ArtifactStore, src: Path, manifest: dict[str, Any], work: Path
) -> tuple[set[str], set[str], int, int]:
    """Copy every blob and model file the manifest lists from `src` into `work`, each checked as it is
    copied; returns the engine digests, the model digests, the file count and the bytes."""
    blobs: set[str] = set()
    models: set[str] = set()
    files = size = 0
    for entry in manifest["blobs"]:
        sha256 = str(entry["sha256"])
        if not is_digest(sha256):
            raise IntegrityCheckError(f"the manifest lists a blob digest that is not a sha256: {sha256!r}")
        relative = store.relative(store.blob_path(sha256))
        if entry["path"] != relative:
            raise IntegrityCheckError(f"the manifest lists blob {sha256} at {entry['path']!r}, not at {relative}")
        got = restore_verified(src / relative, work / relative, sha256, int(entry["size"]), "backup blob")
        blobs.add(sha256)
        files, size = files + 1, size + got.size
    for model in manifest["models"]:
        digest = str(model["digest"])
        what = f"model {digest}"
        if not is_digest(digest):
            raise IntegrityCheckError(f"the manifest lists a model digest that is not a sha256: {digest!r}")
        hashed: dict[str, DigestResult] = {}
        for entry in model["files"]:
            name = str(entry["name"])
            relative = bundle_file(digest, name, what)
            if entry["path"] != relative:
                raise IntegrityCheckError(f"the manifest lists {what}'s {name} at {entry['path']!r}, not at {relative}")
            hashed[name] = restore_verified(
                src / relative, work / relative, str(entry["sha256"]), int(entry["size"]), "backup file"
            )
            files, size = files + 1, size + hashed[name].size
        if str(model["filename"]) not in hashed or bundle_digest(str(model["filename"]), hashed) != digest:
            raise IntegrityCheckError(
                f"the backup's bundle of {what} ({src / 'models' / digest}) does not hash to its digest"
            )
        models.add(digest)
    return blobs, models, files, size
