"""A stored blob re-hashed where it is kept (`enginecache verify --remote`): read by byte ranges, in
order, `range_concurrency` at once, and never held whole.

The ranges are the blob's chunks (core.chunkdigests): where the row records chunk digests each range
is checked against its chunk's BLAKE3 on the thread that read it, and every chunk of the recorded size
passing proves what the whole-file sha256 would (the row records both from one pass); where it records
none, the ranges are fed in order to one sha256. A mismatch is IntegrityCheckError naming the object
and, with chunk digests, the chunk and its byte range. Memory: at most `concurrency` ranges.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor

from enginecache.core.blobbackend import BlobBackend
from enginecache.core.chunkdigests import CHUNK_DIGEST_BYTES, chunk_ranges, decode
from enginecache.core.hashing import StreamHasher
from enginecache.errors import IntegrityCheckError


def check_stored_blob(source: BlobBackend, *, name: str, sha256: str, size: int, chunk_blake3: str | None) -> None:
    """Raise IntegrityCheckError unless `source` holds the `size` bytes whose sha256 is `sha256`
    (`name`: the object as messages name it); StoreError where `source` cannot be read."""
    stored = source.stat_blob(sha256)
    if stored is None:
        raise IntegrityCheckError(f"{name} is missing")
    if stored != size:
        raise IntegrityCheckError(f"{name} is {stored} bytes, recorded {size}")
    chunks = decode(chunk_blake3)
    ranges = chunks.ranges(size) if chunks is not None else chunk_ranges(size, CHUNK_DIGEST_BYTES)
    hasher = None if chunks is not None else StreamHasher(with_blake3=False)

    def read(index: int) -> memoryview:
        start, end = ranges[index]
        data = source.read_range(sha256, start, end)
        if len(data) != end - start:
            raise IntegrityCheckError(f"{name}: bytes {start}-{end - 1} came back {len(data)} bytes long")
        if chunks is not None:
            chunks.check(name, index, data)
        return data

    window = max(1, source.range_concurrency)
    with ThreadPoolExecutor(max_workers=window, thread_name_prefix="remote-check") as pool:
        pending: deque[Future[memoryview]] = deque()
        following = 0
        try:
            while pending or following < len(ranges):
                while following < len(ranges) and len(pending) < window:
                    pending.append(pool.submit(read, following))
                    following += 1
                data = pending.popleft().result()
                if hasher is not None:
                    hasher.update(data)
        finally:
            for future in pending:
                future.cancel()
    if hasher is not None:
        got = hasher.result().sha256
        if got != sha256:
            raise IntegrityCheckError(f"{name}: its bytes hash to sha256 {got}, recorded {sha256}")
