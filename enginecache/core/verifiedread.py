"""A whole file handed to a runtime as memory, every byte hashed and checked before anyone sees it.

Two ways, one checking (chunk digests on every core, else the whole file's BLAKE3 or sha256):

- `map_file`: a leased store file (`core.filelease`) mapped read-only and shared, hashed from the
  mapping. No copy and no buffer of the engine's size: on a host with many cores the copy into a
  new buffer is the read's whole cost (docs/performance.md, "16-core host"). Only under a lease,
  which is what makes a mapping's bytes stay the hashed ones.
- `read_verified` (and `read_verified_into`, into the caller's buffer): the file read into a new
  buffer while it is hashed, where no lease can be had. The rest of this docstring is about it.

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
- The file is read by positioned reads (`preadv`) of fixed ranges, from `PIPELINE_BYTES` up on
  one thread per core (the calling thread among them; `threading` imported only then). Where the
  catalog records the blob's chunk digests (`core.chunkdigests`), each range is one chunk, hashed
  by the thread that read it a 1 MiB piece at a time, while the piece is in that core's cache:
  reading and hashing overlap on every core, and a mismatch names the chunk and its byte range.
  Without them (a row from before chunk digests, or a blob of one chunk) the whole file's BLAKE3
  runs on every core once every byte is in, and a sha256 (rows before BLAKE3) on one. The floor
  bench/bench_read.py holds this to is the two done apart on all cores: a parallel read plus a
  parallel BLAKE3 of the same bytes.
- What only one path needs is imported on first use (`hashlib` for sha256, `ctypes`,
  `threading`): a new process pays for what it uses, which the 10 MiB figure shows.
- The size comes from `fstat` of the open file. A short read (the file shrank), a byte past that
  size (it grew), a chunk list that does not cover that size, or a digest mismatch raises
  `IntegrityCheckError`; the caller gets the buffer only after every byte in it was hashed.
"""

from __future__ import annotations

import contextlib  # imported by the interpreter's own start (site): free
import mmap
import os
import sys

import blake3

from enginecache.core.chunkdigests import CHUNK_DIGEST_BYTES, ChunkDigests, chunk_ranges, decode
from enginecache.core.hashing import PIPELINE_BYTES, check_expected, new_sha256
from enginecache.errors import IntegrityCheckError, LoadFailedError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal, TypedDict, Unpack, overload

    from _typeshed import StrPath  # str | os.PathLike[str]: a cache hit passes `str` (core.pathtext says why)
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

    from enginecache.core.filelease import ReadLease

    class _Expected(TypedDict, total=False):
        """`read_verified`'s keyword arguments besides `as_bytes` (its overloads differ in that alone)."""

        sha256: str | None
        blake3_digest: str | None
        chunk_blake3: str | None


HUGE_PAGE_BYTES = 2 * 1024 * 1024
# From this size a buffer is an uninitialised object on huge pages (below: a plain bytearray).
LARGE_READ_BYTES = 4 * 1024 * 1024
# A chunk is read and hashed this much at a time: the hash finds the piece still in the core's cache.
HASH_PIECE_BYTES = 1024 * 1024


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


def pread_exactly(path: StrPath, fd: int, target: memoryview, at: int) -> None:
    """Fill all of `target` with the bytes of `fd` from file offset `at` by positioned reads; a
    file that ends early (it shrank) raises IntegrityCheckError naming `path` and the offset."""
    end = at + len(target)
    done = 0
    while at + done < end:
        n = os.preadv(fd, [target[done:]], at + done)
        if not n:
            raise IntegrityCheckError(f"{path}: file shrank while reading (no bytes at {at + done} of {end})")
        done += n


def _read_checked_chunk(
    path: StrPath, fd: int, view: memoryview, chunks: ChunkDigests, index: int, start: int, end: int
) -> None:
    """Read chunk `index` (bytes `[start, end)`) into `view` a HASH_PIECE_BYTES piece at a time, each
    piece hashed right after it landed, while it is still in the core's cache; then check the chunk."""
    hasher = blake3.blake3()
    offset = start
    while offset < end:
        stop = min(offset + HASH_PIECE_BYTES, end)
        pread_exactly(path, fd, view[offset:stop], offset)
        hasher.update(view[offset:stop])
        offset = stop
    chunks.check_digest(os.fspath(path), index, hasher.hexdigest(), end - start)


class _RangeRunner:
    """Runs `work(index, start, end)` for each of `ranges` on `workers` threads (the calling thread is
    one of them). `run()` returns once every range was done, or raises the error of the lowest range
    that failed (the others stop taking ranges)."""

    def __init__(self, ranges: list[tuple[int, int]], work: Callable[[int, int, int], None]) -> None:
        self._ranges, self._do = ranges, work
        self._next = iter(range(len(ranges)))  # next() on a range iterator is atomic under the GIL
        self._errors: list[tuple[int, BaseException]] = []

    def _work(self) -> None:
        # Ranges are taken in order and a taken range is always done: every range below a failed one
        # was done, so the lowest failure is the file's first bad range.
        while not self._errors:
            index = next(self._next, None)
            if index is None:
                return
            start, end = self._ranges[index]
            try:
                self._do(index, start, end)
            except BaseException as err:  # noqa: BLE001 - not swallowed: run() raises it in the calling thread
                self._errors.append((index, err))
                return

    def run(self, workers: int) -> None:
        helpers = []
        if workers > 1:
            import threading

            helpers = [threading.Thread(target=self._work, name="read_verified") for _ in range(workers - 1)]
            for helper in helpers:
                helper.start()
        try:
            self._work()
        finally:
            for helper in helpers:
                helper.join()
        if self._errors:
            raise min(self._errors, key=lambda found: found[0])[1]


def _workers(size: int, pieces: int) -> int:
    """Threads for a read of `size` bytes in `pieces` ranges: one below PIPELINE_BYTES (a thread
    costs more than it saves there), else one per core, at most one per range."""
    if size < PIPELINE_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, pieces))


def _fill_and_verify(
    path: StrPath,
    fd: int,
    view: memoryview,
    size: int,
    sha256: str | None,
    blake3_digest: str | None,
    chunks: ChunkDigests | None,
) -> None:
    """Read exactly `size` bytes of `fd` into `view` and check them: each chunk against its digest as
    it lands where `chunks` is recorded (a mismatch names the chunk), else the whole file's BLAKE3
    (every core) or sha256 once every byte is in. A file that changed size raises IntegrityCheckError."""
    ranges = chunks.ranges(size) if chunks is not None else chunk_ranges(size, CHUNK_DIGEST_BYTES)

    def read_range(index: int, start: int, end: int) -> None:
        if chunks is not None:
            _read_checked_chunk(path, fd, view, chunks, index, start, end)
        else:
            pread_exactly(path, fd, view[start:end], start)

    _RangeRunner(ranges, read_range).run(_workers(size, len(ranges)))
    if os.pread(fd, 1, size):
        raise IntegrityCheckError(f"{path}: file grew while reading (more than {size} bytes)")
    if chunks is None:
        _check_whole(path, view, size, sha256, blake3_digest)


def _check_whole(path: StrPath, view: memoryview, size: int, sha256: str | None, blake3_digest: str | None) -> None:
    """Check the whole file's bytes in `view[:size]`: BLAKE3 on every core from PIPELINE_BYTES up
    where it is recorded, else sha256 on one. A mismatch raises IntegrityCheckError naming `path`."""
    if blake3_digest is not None:
        b3 = blake3.blake3(max_threads=blake3.blake3.AUTO if size >= PIPELINE_BYTES else 1)
        got = b3.update(view[:size]).hexdigest()
        if got != blake3_digest:
            raise IntegrityCheckError(f"{path}: blake3 {got} does not match recorded {blake3_digest}")
        return
    sha = new_sha256()
    sha.update(view[:size])
    got = sha.hexdigest()
    if got != sha256:
        raise IntegrityCheckError(f"{path}: sha256 {got} does not match recorded {sha256}")


def _chunks_to_check(blake3_digest: str | None, chunk_blake3: str | None) -> ChunkDigests | None:
    """The chunk list a read checks: recorded, and beside a BLAKE3 identity (a row with sha256 alone
    predates both)."""
    return decode(chunk_blake3) if blake3_digest is not None and chunk_blake3 else None


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
    chunk_blake3: str | None = None,
    as_bytes: bool = False,
) -> memoryview | bytes:
    """Read a whole file into one new buffer while hashing the same bytes; check the digest.

    Pass `blake3_digest` for the fast path or `sha256` for the recorded one (when both are given,
    BLAKE3 is checked); `chunk_blake3`, the chunk digests recorded with the BLAKE3 digest
    (`core.chunkdigests`' encoding), makes each chunk checked as it lands. By default the result is
    a writable `memoryview` (of an anonymous mapping from LARGE_READ_BYTES up, of a bytearray
    below); `as_bytes=True` returns `bytes` instead (what
    ONNX Runtime's Python binding takes, so it needs no copy; TensorRT's `deserialize_cuda_engine`
    takes either). Every byte is hashed before the buffer is returned. Raises `IntegrityCheckError`
    when the bytes do not match, or when the file shrinks or grows while it is read.
    """
    check_expected(sha256, blake3_digest)
    chunks = _chunks_to_check(blake3_digest, chunk_blake3)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        buffer, view = _allocate(size, as_bytes)
        target = view if view is not None else memoryview(buffer)
        try:
            _fill_and_verify(path, fd, target, size, sha256, blake3_digest, chunks)
        finally:
            target.release()
    finally:
        os.close(fd)
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
    chunk_blake3: str | None = None,
) -> int:
    """Read a whole file into the caller's writable `buffer` (pinned host memory for a device
    copy, say) while hashing the same bytes; check the digest as `read_verified` does.

    Returns the file's size; bytes of `buffer` past it are left as they were. Raises ValueError
    when the buffer is smaller than the file.
    """
    check_expected(sha256, blake3_digest)
    chunks = _chunks_to_check(blake3_digest, chunk_blake3)
    with open(path, "rb", buffering=0) as stream, memoryview(buffer) as raw:
        size = os.fstat(stream.fileno()).st_size
        view = raw.cast("B") if raw.format != "B" or raw.ndim != 1 else raw
        if view.readonly:
            raise ValueError("read_verified_into needs a writable buffer")
        if view.nbytes < size:
            raise ValueError(f"{path}: {size} bytes do not fit a buffer of {view.nbytes}")
        _fill_and_verify(path, stream.fileno(), view, size, sha256, blake3_digest, chunks)
    return size


class MappedFile:
    """A leased file mapped read-only and shared (`map_file`); `view` is the whole file. `verify`
    checks it; `close()` (or leaving the `with` block) unmaps it, and must come before the lease is
    given back: it raises LoadFailedError where something still holds a view of the mapping (a
    runtime that kept the engine it was lent), which would otherwise read the file unleased."""

    __slots__ = ("_mapping", "name", "view")

    def __init__(self, mapping: mmap.mmap | None, view: memoryview, name: StrPath) -> None:
        self._mapping, self.view, self.name = mapping, view, name

    def verify(
        self, *, sha256: str | None = None, blake3_digest: str | None = None, chunk_blake3: str | None = None
    ) -> None:
        """Hash every byte from the mapping and check it, as `read_verified` checks: each chunk on every
        core where `chunk_blake3` is recorded (a mismatch names the chunk and its byte range), else the
        whole file's BLAKE3 on every core, or its sha256. Hashing touches every page from every core,
        so a runtime that reads the view next finds it mapped in, not faulted a page at a time on its
        own thread. Raises IntegrityCheckError when the bytes do not match (naming `name`)."""
        check_expected(sha256, blake3_digest)
        chunks = _chunks_to_check(blake3_digest, chunk_blake3)
        view, size = self.view, len(self.view)
        if chunks is None:
            _check_whole(self.name, view, size, sha256, blake3_digest)
            return
        shown = os.fspath(self.name)
        ranges = chunks.ranges(size)

        def check_chunk(index: int, start: int, end: int) -> None:
            with view[start:end] as piece:  # not kept by a mismatch's traceback
                chunks.check(shown, index, piece)

        _RangeRunner(ranges, check_chunk).run(_workers(size, len(ranges)))

    def close(self) -> None:
        self.view.release()
        mapping, self._mapping = self._mapping, None
        if mapping is None:
            return
        try:
            mapping.close()
        except BufferError as err:
            raise LoadFailedError(f"{self.name}: a view of the mapped engine was kept past its load") from err

    def __enter__(self) -> MappedFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, *rest: object) -> None:
        if kind is None:
            self.close()
            return
        try:
            self.close()
        except LoadFailedError:  # the error in flight is the one to report; this one is logged beside it
            import logging

            logging.getLogger(__name__).exception("%s: unmapping after a failed load", self.name)


def map_file(lease: ReadLease, *, name: StrPath) -> MappedFile:
    """The leased file (`core.filelease`) mapped read-only and shared: the page cache's own pages, no
    copy and no buffer of the engine's size. Nothing in it is checked until `verify()`.

    Sound only under the lease: the view shows the file as it is, so the caller checks
    `lease.intact()` once the runtime is done with the view, as for a file the runtime reads itself,
    and closes the mapping before the lease goes. A truncate of the file waits for the lease's holder
    up to /proc/sys/fs/lease-break-time (45 s by default); one that went through while a runtime still
    read the view, or a read error of the disk under it, would end the process with SIGBUS where a
    read would have raised (the store never truncates a blob). `name` is the file as errors name it.
    Raises OSError where this host cannot map it (the caller reads a verified copy instead).
    """
    size = os.fstat(lease.fd).st_size
    if size == 0:  # mmap refuses an empty mapping; an empty file is checked like any other
        return MappedFile(None, memoryview(b""), name)
    mapping = mmap.mmap(lease.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    return MappedFile(mapping, memoryview(mapping), name)
