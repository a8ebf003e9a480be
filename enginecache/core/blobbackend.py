"""The one interface every blob backend satisfies: the local folder (`core.store.ArtifactStore`) and
S3-compatible object storage (`core.objectstore.S3BlobStore`).

A blob is named by the sha256 of its bytes, and a backend keeps it under a key derived from that
digest alone (`objects/sha256/<2 hex>/<sha256>` below its root). What a backend promises:

- `put_blob` stores bytes whose digest the caller has already computed, and never overwrites: where
  an object with that name exists, the backend checks that it is the same blob (size and digest, not
  trust) and keeps it, or raises IntegrityCheckError where it is not (leaving it as it is);
- `read_blob` streams the stored bytes, as stored, into a sink, and `read_range` returns a byte range
  of them (`range_concurrency` at once: a ranged fetch, core.rangedfetch): neither verifies them;
  the reader does, as they land (`ArtifactStore.fetch`), so a backend cannot vouch for bytes nobody
  hashed;
- absence is IntegrityCheckError for `read_blob` (a recorded blob that is gone), None for
  `stat_blob`; a backend that cannot be reached or written raises StoreError (an UnavailableError:
  try again later), never a library's own exception.

Nothing here imports a backend: the interface costs a load path nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

# Receives the stored bytes in order, a chunk at a time (a HashingWriter's `write`).
BlobSink = Callable[[memoryview], object]


class BlobBackend(Protocol):
    """Where blobs are kept, by their sha256."""

    def describe(self) -> str:
        """Where this backend keeps blobs, for messages (a folder, `s3://bucket/prefix`)."""
        ...

    def stat_blob(self, sha256: str) -> int | None:
        """The size in bytes of the stored blob named `sha256`, or None where none is stored."""
        ...

    def put_blob(self, sha256: str, source: Path, size: int) -> bool:
        """Store the `size` bytes of `source`, whose sha256 the caller computed as `sha256`. Returns
        whether it wrote (False: the same blob was stored already, checked, and kept)."""
        ...

    def read_blob(self, sha256: str, sink: BlobSink, *, size: int | None = None) -> None:
        """Stream the stored bytes of `sha256` into `sink`, unverified. With `size`, a stored blob of
        another size is refused (IntegrityCheckError) before any byte reaches the sink."""
        ...

    @property
    def range_concurrency(self) -> int:
        """How many `read_range` calls one fetch runs at once."""
        ...

    def read_range(self, sha256: str, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the stored blob `sha256`, unverified (shorter where the blob ends
        sooner). IntegrityCheckError where no such blob is stored."""
        ...
