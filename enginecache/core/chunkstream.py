"""An engine blob as a stream that hands out only verified bytes, a chunk at a time.

A runtime that deserializes from a stream instead of one host buffer (TensorRT's
`IStreamReaderV2`, whose Python form asks `read(num_bytes, stream) -> bytes` and
`seek(offset, where) -> bool`; `core.backends.trt.streamload` adapts this class to it) never
needs the whole engine in host memory: `VerifiedChunkStream` reads the chunk that holds the current
position into one reused buffer, checks it against its recorded chunk digest (`core.chunkdigests`),
and only then returns bytes from it. A read never returns bytes past the end of the verified chunk
(the caller asks again, as TensorRT does for a short read), so no byte leaves before its chunk
matched. Peak host memory is one chunk, not one engine.

It needs the blob's chunk digests: a row without them has nothing to check a chunk against, and its
load reads the whole blob verified instead (ValueError here). A mismatch, a file that is shorter
than the list covers, or a seek outside the blob raises IntegrityCheckError / ValueError; the stream
is then closed and every later read raises too.
"""

from __future__ import annotations

import os

from enginecache.core.chunkdigests import ChunkDigests, decode
from enginecache.core.verifiedread import pread_exactly
from enginecache.errors import IntegrityCheckError

SEEK_SET, SEEK_CUR, SEEK_END = os.SEEK_SET, os.SEEK_CUR, os.SEEK_END


class VerifiedChunkStream:
    """Sequential, seekable reads of a blob's verified bytes (module docstring). Use as a context
    manager, or `close()` it."""

    def __init__(self, path: str | os.PathLike[str], chunk_blake3: str | None) -> None:
        chunks = decode(chunk_blake3)
        if chunks is None:
            raise ValueError(f"{os.fspath(path)}: no chunk digests recorded: read it whole, verified, instead")
        self._name = os.fspath(path)
        self._chunks: ChunkDigests = chunks
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.size = os.fstat(self._fd).st_size
        self._ranges = chunks.ranges(self.size)  # IntegrityCheckError where the list cannot cover the file
        self._buffer = bytearray(chunks.chunk_bytes)
        self._loaded = -1  # the chunk whose verified bytes are in _buffer
        self._failed: BaseException | None = None
        self.position = 0

    def __enter__(self) -> VerifiedChunkStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _load(self, index: int) -> None:
        start, end = self._ranges[index]
        view = memoryview(self._buffer)[: end - start]
        pread_exactly(self._name, self._fd, view, start)
        self._chunks.check(self._name, index, view)
        self._loaded = index

    def read(self, num_bytes: int) -> bytes:
        """Up to `num_bytes` verified bytes from the current position, never past the end of its
        chunk; b"" at the end of the blob."""
        if self._failed is not None:
            raise IntegrityCheckError(f"{self._name}: the stream failed earlier: {self._failed}")
        if self._fd < 0:
            raise ValueError(f"{self._name}: the stream is closed")
        if num_bytes <= 0 or self.position >= self.size:
            return b""
        index = self.position // self._chunks.chunk_bytes
        try:
            if index != self._loaded:
                self._load(index)
        except BaseException as err:
            self._failed = err
            self.close()
            raise
        start, end = self._ranges[index]
        take = min(num_bytes, end - self.position)
        data = bytes(self._buffer[self.position - start : self.position - start + take])
        self.position += take
        return data

    def seek(self, offset: int, whence: int = SEEK_SET) -> int:
        """Move the position as `io` streams do (SEEK_SET, SEEK_CUR, SEEK_END); ValueError for a
        position outside [0, size]."""
        base = {SEEK_SET: 0, SEEK_CUR: self.position, SEEK_END: self.size}[whence]
        target = base + offset
        if not 0 <= target <= self.size:
            raise ValueError(f"{self._name}: seek to {target} is outside the blob (0..{self.size})")
        self.position = target
        return target
