"""A whole file read into one new buffer, every byte hashed and checked before anyone sees it.

`read_verified` reads a whole engine blob and checks it before any runtime sees it; how it got
fast is in docs/performance.md ("Verified read"), measured by bench/bench_read.py:

- The buffer is never zero-filled by us. `bytearray(size)` writes every byte once (memset)
  before the read writes it again, and faults its pages in 4 KiB at a time: on these machines
  that costs more than the read itself. From LARGE_READ_BYTES up the buffer is what the floor of
  bench/bench_read.py reads into: a private anonymous mapping (`mmap.mmap(-1, size,
  MAP_PRIVATE | MAP_ANONYMOUS)`) with `MADV_HUGEPAGE`, so the read faults it in 2 MiB pages,
  and the caller gets a writable `memoryview` of it (the view keeps the mapping alive). Only
  `as_bytes=True` needs CPython's C API: an immutable `bytes` built by
  `PyBytes_FromStringAndSize(NULL, size)` through ctypes (the C API documents NULL as "contents
  uninitialized", the way C code builds an object it then fills), filled completely while we
  hold the only reference, and advised to huge pages the same way. Other Python
  implementations get a plain bytearray, copied to `bytes`.
- `as_bytes=True` hands back an immutable `bytes`, filled in place before anyone else holds a
  reference: ONNX Runtime's Python binding takes `bytes` only, and a `bytes` needs no copy.
  `as_bytes=False` returns a `memoryview`: a standalone verified read (a test-load, a device
  copy) imports no ctypes.
- Past `PIPELINE_BYTES`, hashing trails the read on one helper thread over the same buffer
  (sha256 and BLAKE3 both release the GIL); the helper takes everything read so far in one
  `update`, and BLAKE3 may use every core for it (`max_threads=AUTO`), so the hash catches up
  once the read is done. Below it, one thread reads then hashes: starting a thread (and
  importing `threading`) costs more than it saves there, and a multi-threaded hash of a few MiB
  waits on whichever core a neighbour holds.
- What only one path needs is imported on first use (`hashlib` for sha256, `ctypes`,
  `threading`): a new process pays for what it uses, which the 10 MiB figure shows.
- The size comes from `fstat` of the open file. A short read (the file shrank) or a byte past
  that size (it grew) raises `IntegrityCheckError`, and so does a digest mismatch; the caller
  gets the buffer only after every byte in it was hashed.
"""

from __future__ import annotations

import contextlib  # imported by the interpreter's own start (site): free
import mmap
import os
import sys

import blake3

from enginecache.core.hashing import CHUNK_BYTES, PIPELINE_BYTES, check_expected, new_sha256
from enginecache.errors import IntegrityCheckError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import BinaryIO, Literal, TypedDict, Unpack, overload

    from _typeshed import StrPath  # str | os.PathLike[str]: a cache hit passes `str` (core.pathtext says why)
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

    class _Expected(TypedDict, total=False):
        """`read_verified`'s keyword arguments besides `as_bytes` (its overloads differ in that alone)."""

        sha256: str | None
        blake3_digest: str | None
        chunk_bytes: int


HUGE_PAGE_BYTES = 2 * 1024 * 1024
# From this size a buffer is an uninitialised object on huge pages (below: a plain bytearray).
LARGE_READ_BYTES = 4 * 1024 * 1024


class _BytesAllocator:
    """Uninitialised `bytes` objects through CPython's C API (ctypes, loaded on first use)."""

    def __init__(self) -> None:
        import ctypes

        api = ctypes.pythonapi
        self._new_bytes = api.PyBytes_FromStringAndSize
        self._new_bytes.restype = ctypes.py_object
        self._new_bytes.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
        self._bytes_data = api.PyBytes_AsString
        self._bytes_data.restype = ctypes.c_void_p
        self._bytes_data.argtypes = (ctypes.py_object,)
        self._madvise: Callable[[int, int, int], int] | None = None
        if sys.platform.startswith("linux") and hasattr(mmap, "MADV_HUGEPAGE"):
            libc = ctypes.CDLL(None, use_errno=True)
            madvise = libc.madvise
            madvise.restype = ctypes.c_int
            madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
            self._madvise = madvise
        self._ctypes = ctypes

    def allocate(self, size: int) -> tuple[bytes, memoryview]:
        """A new `bytes` of `size` uninitialised bytes (we hold the only reference) and a writable
        view of its contents, which the caller must fill completely before handing it on."""
        obj = self._new_bytes(None, size)
        address = self._bytes_data(obj)
        if self._madvise is not None:
            start = -(-address // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
            end = (address + size) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
            if end > start:
                self._madvise(start, end - start, mmap.MADV_HUGEPAGE)  # advice only: ignore a refusal
        view = memoryview((self._ctypes.c_char * size).from_address(address)).cast("B")
        return obj, view


_bytes_allocator: _BytesAllocator | None = None


def _anonymous_buffer(size: int) -> tuple[mmap.mmap, memoryview]:
    """A private anonymous mapping of `size` bytes (the kernel's zero pages until written: nothing
    is filled twice), advised to huge pages, and a writable view of it."""
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        # advice only: refused (a kernel without THP), the read faults 4 KiB pages, as a bytearray's would
        with contextlib.suppress(OSError):
            mapping.madvise(mmap.MADV_HUGEPAGE)
    return mapping, memoryview(mapping)


def _allocate(size: int, as_bytes: bool) -> tuple[bytes | bytearray | mmap.mmap, memoryview | None]:
    """A buffer of `size` bytes to read into, and a writable view of it.

    From LARGE_READ_BYTES up: an uninitialised `bytes` (as_bytes on CPython) or an anonymous
    mapping. The view is None where the object itself is the writable buffer (a bytearray: small
    sizes, and `bytes` on Python implementations other than CPython, built from it at the end).
    """
    global _bytes_allocator
    if size >= LARGE_READ_BYTES:
        if not as_bytes:
            return _anonymous_buffer(size)
        if sys.implementation.name == "cpython":
            if _bytes_allocator is None:
                _bytes_allocator = _BytesAllocator()
            return _bytes_allocator.allocate(size)
    return bytearray(size), None


class _TrailingHasher:
    """Hashes a buffer region by region on one helper thread, behind the thread that fills it.

    `advance(end)` says bytes up to `end` are in place; the helper hashes everything announced so
    far in one update. `finish()` waits until every announced byte is hashed.
    """

    def __init__(self, update: Callable[[memoryview], object], view: memoryview) -> None:
        self._update = update
        self._view = view
        import threading
        from queue import SimpleQueue

        self._ends: SimpleQueue[int | None] = SimpleQueue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="read_verified-hash", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        hashed = 0
        done = False
        try:
            while not done:
                end = self._ends.get()
                if end is None:
                    break
                while not self._ends.empty():  # take everything read so far in one update
                    following = self._ends.get()
                    if following is None:
                        done = True
                        break
                    end = following
                self._update(self._view[hashed:end])
                hashed = end
        except BaseException as err:  # noqa: BLE001 - not swallowed: finish() raises it in the reading thread
            self._error = err

    def advance(self, end: int) -> None:
        self._ends.put(end)

    def finish(self) -> None:
        """Wait until every announced byte is hashed; raise what the helper raised, if anything."""
        self.stop()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        self._ends.put(None)
        self._thread.join()


def _fill_and_hash(
    path: StrPath,
    stream: BinaryIO,
    view: memoryview,
    size: int,
    update: Callable[[memoryview], object],
    chunk_bytes: int,
) -> None:
    """Read exactly `size` bytes into `view` while `update` hashes them; catch a file that changed size."""
    hasher = _TrailingHasher(update, view) if size >= PIPELINE_BYTES and size > chunk_bytes else None
    offset = 0
    try:
        while offset < size:
            n = stream.readinto(view[offset : min(offset + chunk_bytes, size)])  # type: ignore[attr-defined]
            if not n:
                raise IntegrityCheckError(f"{path}: file shrank while reading ({offset} of {size} bytes)")
            offset += n
            if hasher is not None:
                hasher.advance(offset)
        if stream.readinto(bytearray(1)):  # type: ignore[attr-defined]
            raise IntegrityCheckError(f"{path}: file grew while reading (more than {size} bytes)")
    except BaseException:
        if hasher is not None:
            hasher.stop()  # the read's own error is the one to raise
        raise
    if hasher is not None:
        hasher.finish()
    else:
        update(view[:size])


def _verify(
    path: StrPath,
    view: memoryview,
    size: int,
    stream: BinaryIO,
    sha256: str | None,
    blake3_digest: str | None,
    chunk_bytes: int,
) -> None:
    if blake3_digest is not None:
        b3 = blake3.blake3(max_threads=blake3.blake3.AUTO if size >= PIPELINE_BYTES else 1)
        _fill_and_hash(path, stream, view, size, b3.update, chunk_bytes)
        got = b3.hexdigest()
        if got != blake3_digest:
            raise IntegrityCheckError(f"{path}: blake3 {got} does not match recorded {blake3_digest}")
        return
    sha = new_sha256()
    _fill_and_hash(path, stream, view, size, sha.update, chunk_bytes)
    got = sha.hexdigest()
    if got != sha256:
        raise IntegrityCheckError(f"{path}: sha256 {got} does not match recorded {sha256}")


if TYPE_CHECKING:  # the overloads are the type checker's: `typing.overload` is not imported at run time

    @overload
    def read_verified(
        path: StrPath, *, as_bytes: Literal[False] = ..., **expected: Unpack[_Expected]
    ) -> memoryview: ...

    @overload
    def read_verified(path: StrPath, *, as_bytes: Literal[True], **expected: Unpack[_Expected]) -> bytes: ...

    @overload
    def read_verified(path: StrPath, *, as_bytes: bool, **expected: Unpack[_Expected]) -> bytes | memoryview: ...


def read_verified(
    path: StrPath,
    *,
    sha256: str | None = None,
    blake3_digest: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    as_bytes: bool = False,
) -> memoryview | bytes:
    """Read a whole file into one new buffer while hashing the same bytes; check the digest.

    Pass `blake3_digest` for the fast path or `sha256` for the recorded one (when both are given,
    BLAKE3 is checked). By default the result is a writable `memoryview` (of an anonymous mapping
    from LARGE_READ_BYTES up, of a bytearray below); `as_bytes=True` returns `bytes` instead (what
    ONNX Runtime's Python binding takes, so it needs no copy; TensorRT's `deserialize_cuda_engine`
    takes either). Every byte is hashed before the buffer is returned. Raises `IntegrityCheckError`
    when the bytes do not match, or when the file shrinks or grows while it is read.
    """
    check_expected(sha256, blake3_digest)
    with open(path, "rb", buffering=0) as stream:
        size = os.fstat(stream.fileno()).st_size
        buffer, view = _allocate(size, as_bytes)
        target = view if view is not None else memoryview(buffer)
        try:
            _verify(path, target, size, stream, sha256, blake3_digest, chunk_bytes)
        finally:
            target.release()
    if not as_bytes:
        return memoryview(buffer)
    if not isinstance(buffer, bytes):
        return bytes(buffer)  # small sizes (and non-CPython): one copy of a small buffer
    return buffer


def read_verified_into(
    path: StrPath,
    buffer: Buffer,
    *,
    sha256: str | None = None,
    blake3_digest: str | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> int:
    """Read a whole file into the caller's writable `buffer` (pinned host memory for a device
    copy, say) while hashing the same bytes; check the digest as `read_verified` does.

    Returns the file's size; bytes of `buffer` past it are left as they were. Raises ValueError
    when the buffer is smaller than the file.
    """
    check_expected(sha256, blake3_digest)
    with open(path, "rb", buffering=0) as stream, memoryview(buffer) as raw:
        size = os.fstat(stream.fileno()).st_size
        view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
        if view.readonly:
            raise ValueError("read_verified_into needs a writable buffer")
        if view.nbytes < size:
            raise ValueError(f"{path}: {size} bytes do not fit a buffer of {view.nbytes}")
        _verify(path, view, size, stream, sha256, blake3_digest, chunk_bytes)
    return size
