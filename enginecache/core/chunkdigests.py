"""Chunk digests: a blob cut into fixed-size chunks, each with its own BLAKE3, beside its whole-file digest.

A blob larger than one chunk (CHUNK_DIGEST_BYTES) gets the ordered list of its chunks' BLAKE3
digests, computed in the pass that computes its identity (`core.hashing.StreamHasher`) and recorded
with it (the catalog's `engines.chunk_blake3`, pull manifests). The whole-file sha256 stays the
blob's identity; the list is trusted exactly as far as the row that records both. With it:

- a read verifies chunks on every core as they land (`core.verifiedread`), and checking every
  chunk of a blob of the recorded size proves what the whole-file digest would;
- a download fetches and verifies chunks independently, so a killed one resumes at whole chunks;
- a mismatch names the chunk and its byte range.

Encoding (one text column, decoded by slicing, no JSON): `"<chunk_bytes>:<hex><hex>..."`, 64 hex
characters per chunk, in order; "" for a blob of at most one chunk and for rows recorded before
chunk digests existed (their reads check the whole-file digest, and `enginecache verify` adds the
list). Imports only `blake3` (already on the load path) and the error tree.
"""

from __future__ import annotations

import os

import blake3

from enginecache.errors import IntegrityCheckError

CHUNK_DIGEST_BYTES = 32 * 1024 * 1024
HEX_CHARS = 64  # a BLAKE3 digest of 32 bytes, in hex
_NOT_HEX = str.maketrans("", "", "0123456789abcdef")  # deletes hex digits: what is left is not hex


class ChunkDigests:
    """A decoded chunk list: `chunk_bytes` and the digests in order (`digests[i]` covers bytes
    `[i * chunk_bytes, min((i + 1) * chunk_bytes, size))`)."""

    __slots__ = ("chunk_bytes", "digests")

    def __init__(self, chunk_bytes: int, digests: tuple[str, ...]) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk size must be positive, not {chunk_bytes}")
        self.chunk_bytes = chunk_bytes
        self.digests = digests

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ChunkDigests) and other.chunk_bytes == self.chunk_bytes and other.digests == self.digests
        )

    def __hash__(self) -> int:
        return hash((self.chunk_bytes, self.digests))

    def __repr__(self) -> str:
        return f"ChunkDigests({self.chunk_bytes}, {len(self.digests)} chunks)"

    def encode(self) -> str:
        return f"{self.chunk_bytes}:{''.join(self.digests)}"

    def ranges(self, size: int) -> list[tuple[int, int]]:
        """The byte range of each chunk of a blob of `size` bytes, after checking that the list
        covers exactly that size (IntegrityCheckError otherwise: the row and the blob disagree)."""
        expected = chunk_count(size, self.chunk_bytes)
        if expected != len(self.digests):
            raise IntegrityCheckError(
                f"{len(self.digests)} chunk digests of {self.chunk_bytes} bytes cannot cover {size} bytes "
                f"({expected} chunks)"
            )
        return chunk_ranges(size, self.chunk_bytes)

    def check(self, name: str, index: int, data: bytes | bytearray | memoryview) -> None:
        """Raise IntegrityCheckError naming chunk `index` and its byte range unless `data` is that
        chunk's bytes (hashed on the calling thread: callers run checks on several threads)."""
        self.check_digest(name, index, blake3.blake3(data).hexdigest(), len(data))

    def check_digest(self, name: str, index: int, got: str, length: int) -> None:
        """`check` for a chunk of `length` bytes the caller hashed itself, to `got`."""
        if got != self.digests[index]:
            start = index * self.chunk_bytes
            raise IntegrityCheckError(
                f"{name}: chunk {index} (bytes {start}-{start + length - 1}) hashes to blake3 {got}, "
                f"recorded {self.digests[index]}"
            )


def chunk_count(size: int, chunk_bytes: int = CHUNK_DIGEST_BYTES) -> int:
    return -(-size // chunk_bytes)


def chunk_ranges(size: int, chunk_bytes: int = CHUNK_DIGEST_BYTES) -> list[tuple[int, int]]:
    """`(start, end)` of each chunk of a blob of `size` bytes, in order; the last may be short."""
    return [(start, min(start + chunk_bytes, size)) for start in range(0, size, chunk_bytes)]


def decode(text: str | None) -> ChunkDigests | None:
    """The chunk list a column holds, or None where it holds none ("" or NULL). IntegrityCheckError
    for text that is not an encoded list (a damaged row must not pass for a verified one)."""
    if not text:
        return None
    size_text, _, digests = text.partition(":")
    if not size_text.isdigit() or not digests or len(digests) % HEX_CHARS:
        raise IntegrityCheckError(f"recorded chunk digests are malformed: {text[:80]!r}")
    if digests.translate(_NOT_HEX):
        raise IntegrityCheckError(f"recorded chunk digests are not lowercase hex: {text[:80]!r}")
    return ChunkDigests(int(size_text), tuple(digests[i : i + HEX_CHARS] for i in range(0, len(digests), HEX_CHARS)))


class ChunkHasher:
    """Feeds a stream's bytes, in whatever pieces they come, to one BLAKE3 per chunk; `encoded()` is
    the column's text ("" for a stream of at most one chunk)."""

    __slots__ = ("_chunk_bytes", "_current", "_digests", "_filled")

    def __init__(self, chunk_bytes: int | None = None) -> None:
        self._chunk_bytes = chunk_bytes or CHUNK_DIGEST_BYTES
        self._current = blake3.blake3()
        self._filled = 0
        self._digests: list[str] = []

    def update(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) or data.format != "B" else data
        while len(view):
            take = min(self._chunk_bytes - self._filled, len(view))
            self._current.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == self._chunk_bytes:
                self._digests.append(self._current.hexdigest())
                self._current = blake3.blake3()
                self._filled = 0

    def encoded(self) -> str:
        digests = list(self._digests)
        if self._filled:
            digests.append(self._current.hexdigest())
        if len(digests) <= 1:
            return ""
        return ChunkDigests(self._chunk_bytes, tuple(digests)).encode()


def check_file_chunks(path: str | os.PathLike[str], encoded: str, name: str | None = None) -> None:
    """Read the file at `path` chunk by chunk and raise IntegrityCheckError for the first chunk that
    does not match its digest in `encoded` (or for a size the list cannot cover); `name` is the file
    as the error names it. Nothing where every chunk matches or `encoded` holds no list."""
    chunks = decode(encoded)
    if chunks is None:
        return
    shown = name if name is not None else os.fspath(path)
    with open(path, "rb", buffering=0) as stream:
        size = os.fstat(stream.fileno()).st_size
        for index, (start, end) in enumerate(chunks.ranges(size)):
            stream.seek(start)
            chunks.check(shown, index, stream.read(end - start))
