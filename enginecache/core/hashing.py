"""Streaming digests: sha256 (the recorded identity) and BLAKE3 (the fast verify path).

Files are read once, in chunks, into one reused buffer; every hash runs over the same bytes.
`verify_file` checks a file where it lies; a whole file read into memory and checked before anyone
sees it is `core.verifiedread`. `hashlib` (sha256) is imported on first use: a cache hit checks BLAKE3.
"""

from __future__ import annotations

import os
import stat

import blake3

from enginecache.core.chunkdigests import ChunkHasher
from enginecache.core.valuetype import Frozen
from enginecache.errors import IntegrityCheckError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
    from typing import Any, BinaryIO

    from _typeshed import StrPath  # str | os.PathLike[str]: a cache hit passes `str` (core.pathtext says why)


CHUNK_BYTES = 8 * 1024 * 1024
# From this size a file's hash uses every core (BLAKE3), and `core.verifiedread` hashes behind its read.
PIPELINE_BYTES = 32 * 1024 * 1024
# The prefix whose BLAKE3 a stream's digest also carries (`DigestResult.head_blake3`): an engine's
# header, all that a backend's header check reads (core.backends.loadtypes.ENGINE_HEADER_BYTES names
# this value), so a load can refuse an engine its host cannot run after reading and verifying these
# bytes alone (service.serving.engineload).
HEAD_BYTES = 4096


class DigestResult(Frozen):
    """Digests and size of one byte stream (a `core.valuetype` value: no `dataclasses` import);
    `head_blake3` is the BLAKE3 of its first HEAD_BYTES bytes (all of them when shorter), "" where
    BLAKE3 was not asked for; `chunk_blake3` its chunk digests as `core.chunkdigests` encodes them
    ("" for a stream of at most one chunk, or where BLAKE3 was not asked for)."""

    sha256: str
    blake3: str
    size: int
    head_blake3: str = ""
    chunk_blake3: str = ""


def head_digest(head: bytes | bytearray | memoryview) -> str:
    """The BLAKE3 hex digest of a stream's first HEAD_BYTES bytes, given at least those (or the whole
    stream, when shorter): what `DigestResult.head_blake3` records."""
    return blake3.blake3(memoryview(head)[:HEAD_BYTES]).hexdigest()


def new_sha256() -> Any:
    """A sha256 hasher (`hashlib` imported on first use)."""
    import hashlib

    return hashlib.sha256()


class StreamHasher:
    """Feeds the same bytes to sha256 and BLAKE3 (and the first HEAD_BYTES to a BLAKE3 of their
    own, and each chunk of `core.chunkdigests` to one of its own) and counts them."""

    def __init__(self, *, with_sha256: bool = True, with_blake3: bool = True) -> None:
        self._sha = new_sha256() if with_sha256 else None
        self._b3 = blake3.blake3() if with_blake3 else None
        self._head = blake3.blake3() if with_blake3 else None
        self._chunks = ChunkHasher() if with_blake3 else None
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if self._sha is not None:
            self._sha.update(data)
        if self._b3 is not None:
            self._b3.update(data)
        if self._head is not None and self.size < HEAD_BYTES:
            self._head.update(memoryview(data)[: HEAD_BYTES - self.size])
        if self._chunks is not None:
            self._chunks.update(data)
        self.size += len(data)

    def result(self) -> DigestResult:
        return DigestResult(
            sha256=self._sha.hexdigest() if self._sha is not None else "",
            blake3=self._b3.hexdigest() if self._b3 is not None else "",
            size=self.size,
            head_blake3=self._head.hexdigest() if self._head is not None else "",
            chunk_blake3=self._chunks.encoded() if self._chunks is not None else "",
        )


def hash_stream(
    stream: BinaryIO,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    sink: Callable[[memoryview], object] | None = None,
    hasher: StreamHasher | None = None,
) -> DigestResult:
    """Hash a readable binary stream to its end with one reused buffer; `sink`, where given, is handed
    each chunk right after it was hashed (so what it receives is exactly what was hashed). `hasher`,
    where given, goes on from what it was fed before (one digest over several streams)."""
    hasher = hasher if hasher is not None else StreamHasher()
    buffer = bytearray(chunk_bytes)
    view = memoryview(buffer)
    while True:
        n = stream.readinto(view)  # type: ignore[attr-defined]
        if not n:
            break
        hasher.update(view[:n])
        if sink is not None:
            sink(view[:n])
    return hasher.result()


def hash_file(path: StrPath, *, chunk_bytes: int = CHUNK_BYTES) -> DigestResult:
    """Hash a file in one pass (sha256 and BLAKE3 over the same chunks)."""
    with open(path, "rb", buffering=0) as stream:
        return hash_stream(stream, chunk_bytes=chunk_bytes)


def hash_durable(path: StrPath) -> DigestResult:
    """Put the file at `path` on disk (fsync), then hash it (`hash_file`): the digests of bytes a
    publish by hard link (`ArtifactStore.publish_hashed`) may name without copying them. The file must
    be private to the caller (nobody else writes it), as a build's output in its work folder is."""
    with open(path, "rb", buffering=0) as stream:
        os.fsync(stream.fileno())
        return hash_stream(stream)


def copy_hashed(source: Path, dest: Path, *, chunk_bytes: int = CHUNK_BYTES, durable: bool = False) -> DigestResult:
    """Copy `source` to `dest` (a new file: an existing one raises FileExistsError; a missing source
    raises FileNotFoundError before `dest` is made) in one pass that hashes the bytes it writes: the
    digests are the copy's, whatever `source` does afterwards. `durable`: the copy keeps the source's
    permission bits and is on disk (fsync) when this returns."""
    with open(source, "rb", buffering=0) as stream, open(dest, "xb") as out:
        got = hash_stream(stream, chunk_bytes=chunk_bytes, sink=out.write)
        if durable:
            out.flush()
            os.fchmod(out.fileno(), stat.S_IMODE(os.fstat(stream.fileno()).st_mode))
            os.fsync(out.fileno())
    return got


def check_file(path: StrPath, *, sha256: str | None, blake3_digest: str | None = None) -> DigestResult:
    """Hash a file in one pass and check it against its recorded sha256, and its BLAKE3 where one is
    recorded; its digests. IntegrityCheckError names the digest that does not match."""
    got = hash_file(path)
    if got.sha256 != sha256:
        raise IntegrityCheckError(f"{path} hashes to sha256 {got.sha256}, recorded {sha256}")
    if blake3_digest and got.blake3 != blake3_digest:
        raise IntegrityCheckError(f"{path} hashes to blake3 {got.blake3}, recorded {blake3_digest}")
    return got


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file, read in chunks."""
    return hash_file(path).sha256


def check_expected(sha256: str | None, blake3_digest: str | None) -> None:
    """A verified read or check needs a digest to check against: ValueError without one."""
    if sha256 is None and blake3_digest is None:
        raise ValueError("read_verified needs an expected sha256 or blake3 digest")


def verify_file(
    path: StrPath,
    *,
    sha256: str | None = None,
    blake3_digest: str | None = None,
    chunk_blake3: str | None = None,
    name: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> int:
    """Hash a file where it lies and check the digest, keeping no copy of it; returns its size.

    For a runtime that then reads the file itself (`core.filelease` says when that is sound). BLAKE3
    (checked when both are given) hashes a read-only mapping of the page cache, on every core from
    PIPELINE_BYTES up; sha256 reads it in chunks through one reused buffer. `name` is the file as
    an error names it (`path` may be a `/proc/self/fd` link). Raises `IntegrityCheckError` when the
    bytes do not match; where `chunk_blake3` (the chunk digests recorded with the BLAKE3 digest) is
    given, the error names the first chunk that does not match.
    """
    check_expected(sha256, blake3_digest)
    shown = name if name is not None else os.fspath(path)
    if blake3_digest is not None:
        size = os.stat(path).st_size
        b3 = blake3.blake3(max_threads=blake3.blake3.AUTO if size >= PIPELINE_BYTES else 1)
        b3.update_mmap(path)
        got = b3.hexdigest()
        if got != blake3_digest:
            if chunk_blake3:  # name the first bad chunk (the rare path pays for reading the file again)
                from enginecache.core.chunkdigests import check_file_chunks

                check_file_chunks(path, chunk_blake3, shown)
            raise IntegrityCheckError(f"{shown}: blake3 {got} does not match recorded {blake3_digest}")
        return size
    with open(path, "rb", buffering=0) as stream:  # an engine recorded before BLAKE3 was
        found = hash_stream(stream, chunk_bytes=chunk_bytes, hasher=StreamHasher(with_blake3=False))
    if found.sha256 != sha256:
        raise IntegrityCheckError(f"{shown}: sha256 {found.sha256} does not match recorded {sha256}")
    return found.size
