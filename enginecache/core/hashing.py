"""Streaming digests: sha256 (the recorded identity) and BLAKE3 (the fast verify path).

Files are read once, in chunks, into one reused buffer; every hash runs over the same bytes.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

from enginecache.errors import IntegrityCheckError

CHUNK_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class DigestResult:
    """Digests and size of one byte stream."""

    sha256: str
    blake3: str
    size: int


class StreamHasher:
    """Feeds the same bytes to sha256 and BLAKE3 and counts them."""

    def __init__(self, *, with_sha256: bool = True, with_blake3: bool = True) -> None:
        self._sha = hashlib.sha256() if with_sha256 else None
        self._b3 = blake3.blake3() if with_blake3 else None
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._sha is not None:
            self._sha.update(data)
        if self._b3 is not None:
            self._b3.update(data)
        self.size += len(data)

    def result(self) -> DigestResult:
        return DigestResult(
            sha256=self._sha.hexdigest() if self._sha is not None else "",
            blake3=self._b3.hexdigest() if self._b3 is not None else "",
            size=self.size,
        )


def hash_stream(stream: BinaryIO, *, chunk_bytes: int = CHUNK_BYTES) -> DigestResult:
    """Hash a readable binary stream to its end with one reused buffer."""
    hasher = StreamHasher()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    while True:
        n = stream.readinto(view)  # type: ignore[attr-defined]
        if not n:
            break
        hasher.update(view[:n])
    return hasher.result()


def hash_file(path: Path, *, chunk_bytes: int = CHUNK_BYTES) -> DigestResult:
    """Hash a file in one pass (sha256 and BLAKE3 over the same chunks)."""
    with open(path, "rb", buffering=0) as stream:
        return hash_stream(stream, chunk_bytes=chunk_bytes)


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    return hash_file(path).sha256


def read_verified(
    path: Path,
    *,
    sha256: str | None = None,
    blake3_digest: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> bytearray:
    """Read a whole file into one pre-sized buffer while hashing the same bytes; check the digest.

    Pass `blake3_digest` for the fast path or `sha256` for the recorded one. Reading and hashing
    overlap: chunk i is hashed on a helper thread (both hash libraries release the GIL) while
    chunk i+1 is read into the next region of the same buffer, so verification costs little
    beyond the read itself. Raises `IntegrityCheckError` when the bytes do not match.
    """
    if sha256 is None and blake3_digest is None:
        raise ValueError("read_verified needs an expected sha256 or blake3 digest")
    hasher = StreamHasher(with_sha256=blake3_digest is None, with_blake3=blake3_digest is not None)
    size = path.stat().st_size
    buffer = bytearray(size)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as stream, ThreadPoolExecutor(max_workers=1) as pool:
        pending: Future[None] | None = None
        offset = 0
        while offset < size:
            n = stream.readinto(view[offset : offset + chunk_bytes])
            if not n:
                raise IntegrityCheckError(f"{path}: file shrank while reading ({offset} of {size} bytes)")
            if pending is not None:
                pending.result()
            pending = pool.submit(hasher.update, view[offset : offset + n])
            offset += n
        if stream.readinto(bytearray(1)):
            raise IntegrityCheckError(f"{path}: file grew while reading (more than {size} bytes)")
        if pending is not None:
            pending.result()
    got = hasher.result()
    if blake3_digest is not None and got.blake3 != blake3_digest:
        raise IntegrityCheckError(f"{path}: blake3 {got.blake3} does not match recorded {blake3_digest}")
    if blake3_digest is None and got.sha256 != sha256:
        raise IntegrityCheckError(f"{path}: sha256 {got.sha256} does not match recorded {sha256}")
    return buffer
