"""A resumable, verified copy of one file into place (what `enginecache pull` does with an engine).

The copy is written to `partial` beside the destination's folder and renamed over `final` only once
every byte matched the expected sha256: a reader of `final` never sees a half-written or wrong file.
A `partial` left by a copy that was killed is resumed, not restarted: its bytes are hashed first (the
digest covers the whole file, so they must be read once anyway) and the copy continues from its size.
A `partial` longer than the source, or one whose bytes turn out not to be the source's, is removed and
the copy fails with IntegrityCheckError (the next attempt starts afresh).
"""

from __future__ import annotations

import os
from pathlib import Path

from enginecache.core.hashing import StreamHasher, hash_stream
from enginecache.core.store import fsync_dir
from enginecache.errors import IntegrityCheckError


def copy_resumable(source: Path, final: Path, partial: Path, *, sha256: str) -> int:
    """Copy `source` to `final` through `partial` (module docstring); returns the bytes copied now
    (0 where `partial` already held everything). Raises IntegrityCheckError on a digest mismatch
    (nothing is left at `final` or `partial`), OSError where a file cannot be read or written."""
    hasher = StreamHasher(with_blake3=False)
    have = 0
    if partial.exists():
        with open(partial, "rb", buffering=0) as kept:
            have = hash_stream(kept, hasher=hasher).size
    total = source.stat().st_size
    if have > total:
        partial.unlink()
        raise IntegrityCheckError(f"{partial}: a partial copy of {have} bytes is longer than {source} ({total})")
    partial.parent.mkdir(parents=True, exist_ok=True)
    with open(source, "rb", buffering=0) as stream, open(partial, "ab") as out:
        stream.seek(have)
        got = hash_stream(stream, hasher=hasher, sink=out.write)
        out.flush()
        os.fsync(out.fileno())
    if got.sha256 != sha256:
        partial.unlink()
        raise IntegrityCheckError(f"{source}: copied bytes hash to sha256 {got.sha256}, not the expected {sha256}")
    partial.chmod(0o444)
    final.parent.mkdir(parents=True, exist_ok=True)
    os.replace(partial, final)
    fsync_dir(final.parent)
    return got.size - have
