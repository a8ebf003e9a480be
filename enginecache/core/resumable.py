"""A resumable, verified copy of one file into place (what `enginecache pull` does with an engine).

The copy is written to `partial` beside the destination's folder and renamed over `final` only once
every byte matched the expected sha256: a reader of `final` never sees a half-written or wrong file.
A `partial` left by a copy that was killed is resumed, not restarted: its bytes are hashed first (the
digest covers the whole file, so they must be read once anyway) and the copy continues from its size.
A `partial` longer than the source, or one whose bytes turn out not to be the source's, is removed and
the copy fails with IntegrityCheckError (the next attempt starts afresh).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from enginecache.core.hashing import CHUNK_BYTES
from enginecache.core.store import fsync_dir
from enginecache.errors import IntegrityCheckError


def _hash_into(digest: hashlib._Hash, path: Path) -> int:
    """Feed `path`'s bytes to `digest`; returns how many."""
    size = 0
    with open(path, "rb", buffering=0) as stream:
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        while n := stream.readinto(view):
            digest.update(view[:n])
            size += n
    return size


def copy_resumable(source: Path, final: Path, partial: Path, *, sha256: str) -> int:
    """Copy `source` to `final` through `partial` (module docstring); returns the bytes copied now
    (0 where `partial` already held everything). Raises IntegrityCheckError on a digest mismatch
    (nothing is left at `final` or `partial`), OSError where a file cannot be read or written."""
    digest = hashlib.sha256()
    have = _hash_into(digest, partial) if partial.exists() else 0
    total = source.stat().st_size
    if have > total:
        partial.unlink()
        raise IntegrityCheckError(f"{partial}: a partial copy of {have} bytes is longer than {source} ({total})")
    copied = 0
    partial.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb", buffering=0) as stream, open(partial, "ab") as out:
        stream.seek(have)
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        while n := stream.readinto(view):
            digest.update(view[:n])
            out.write(view[:n])
            copied += n
        out.flush()
        os.fsync(out.fileno())
    got = digest.hexdigest()
    if got != sha256:
        partial.unlink()
        raise IntegrityCheckError(f"{source}: copied bytes hash to sha256 {got}, not the expected {sha256}")
    partial.chmod(0o444)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)
    fsync_dir(final.parent)
    return copied
