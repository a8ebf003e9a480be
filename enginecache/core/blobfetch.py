"""The load path's one call for a remote store: make an engine's blob present locally before the
verified read (`ArtifactStore.fetch_blob`), at the cost of a lookup where there is nothing to do.

Where no remote is configured, or the blob is stored here already, it is an environment lookup and
a stat: no module is imported (this one imports only core.blobpaths, which the load path has, and
core.storeenv, which imports nothing) and nothing is hashed (the read that follows verifies the bytes). Only
a blob missing here, with a remote configured, loads the store and the S3 client and downloads it.
"""

from __future__ import annotations

import os

from enginecache.core.blobpaths import blob_file, blob_path
from enginecache.core.storeenv import configured

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from pathlib import Path


def ensure_local_blob(
    home: Path, sha256: str | None, *, size: int | None = None, chunk_blake3: str | None = None
) -> Path:
    """The local path of blob `sha256` under `home`, fetched (verified: chunk by chunk against
    `chunk_blake3`, the row's chunk digests, where given; `ArtifactStore.fetch`) from the remote store
    where it is missing here and one is configured. Returns the path even where the blob is in neither
    place and no remote is set: the read that follows finds it missing, as without a remote.

    IntegrityCheckError: not a digest, or the remote's copy is missing or is not the blob (nothing is
    left here); StoreError: the remote cannot be reached or read (try again later)."""
    path = blob_path(home, sha256)
    if _missing_here(str(path)):
        return _fetch(home, str(sha256), size, chunk_blake3)
    return path


def fetch_if_missing(
    home: str | os.PathLike[str], sha256: str | None, *, size: int | None = None, chunk_blake3: str | None = None
) -> None:
    """`ensure_local_blob` for a reader that opens `blob_file(home, sha256)` itself: where no remote
    is configured or the blob is here, string operations and at most one stat (no `pathlib`, which
    a cache hit does not import otherwise); else the fetch. Errors as `ensure_local_blob`."""
    if _missing_here(blob_file(home, sha256)):  # blob_file: IntegrityCheckError for a value that is not a digest
        from pathlib import Path

        _fetch(Path(home), str(sha256), size, chunk_blake3)


def _missing_here(file: str) -> bool:
    """Whether the blob at `file` must come from the remote: one is configured and the file is not
    here (in this order: no stat without a remote)."""
    return configured() and not os.path.isfile(file)


def _fetch(home: Path, sha256: str, size: int | None, chunk_blake3: str | None) -> Path:
    from enginecache.core.store import ArtifactStore

    return ArtifactStore(home).fetch(sha256, size=size, chunk_blake3=chunk_blake3).path
