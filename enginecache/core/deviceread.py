"""An engine file into device memory, every byte checked before the caller gets the device buffer.

`read_verified_to_device(path, device_buffer, ...)` fills a caller's device buffer (anything with
`__cuda_array_interface__`: a CuPy array, a PyTorch tensor) with the file's bytes and checks them
against the digests the catalog records. It needs the `gpu` extra (kvikio, which brings CuPy); it
is the GPU path of a load where the runtime takes device memory, measured on an H200 by
bench/gpu/device_read.py (results in bench/results/device_read_h200.json). Two ways, chosen here:

- **kvikio** (a kept GPUDirect Storage library: `CuFile.pread` on its own thread pool, straight to
  the device with GDS, through its bounce buffers without), then, where the row records chunk
  digests, the GPU hashes the bytes on the device (`core.gpublake3`, every chunk at once): the
  bytes checked are the bytes the runtime gets, and the host's cores only read. A row without
  chunk digests is hashed on the host where it lies while kvikio reads it, both under a read
  lease (`core.filelease`: no one can open the file for writing or truncate it while it holds, so
  the bytes kvikio read are the bytes hashed). Either way the buffer is returned only after the
  digests matched (the first bad chunk named); the device holds unchecked bytes for a moment, but
  no caller, and so no runtime, sees them before the check. CuPy compiles the two kernels on first
  use and keeps them in its on-disk kernel cache.
- **a ring of small pinned buffers** (where kvikio is missing, no lease can be had, or the lease
  broke): one thread per core, each owning one pinned chunk-sized buffer and one CUDA stream, reads
  a chunk (`preadv`), checks it against its chunk digest, and copies it to its place on the
  device asynchronously; a thread waits for its previous copy before it reuses its buffer. Only
  verified chunks reach the device. The whole engine is never pinned: pinning 13.5 GB costs 6-8 s
  by itself. A row without chunk digests is read verified into host memory
  (`core.verifiedread`) and copied once.

Raises IntegrityCheckError when the bytes do not match (the device buffer's contents are then
undefined: discard it), ValueError when the buffer is too small or not device memory,
BackendUnavailableError when neither kvikio nor CuPy is installed.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from enginecache.core.chunkdigests import ChunkDigests, decode
from enginecache.core.filelease import take_read_lease
from enginecache.core.hashing import check_expected, verify_file
from enginecache.core.verifiedread import pread_exactly, read_verified
from enginecache.errors import BackendUnavailableError, IntegrityCheckError

if TYPE_CHECKING:
    from _typeshed import StrPath

GPU_EXTRA_HINT = "pip install 'enginecache[gpu]' (kvikio and CuPy for the CUDA version of this host)"
H2D = 1  # cudaMemcpyHostToDevice


def device_pointer(buffer: Any) -> tuple[int, int]:
    """The device address and size in bytes of a buffer that exposes `__cuda_array_interface__`
    (contiguous, so its bytes are `itemsize * prod(shape)`). ValueError for anything else."""
    interface = getattr(buffer, "__cuda_array_interface__", None)
    if interface is None:
        raise ValueError(f"{type(buffer).__name__} is not device memory (no __cuda_array_interface__)")
    if interface.get("strides") not in (None, ()):
        raise ValueError("the device buffer must be contiguous")
    count = 1
    for extent in interface["shape"]:
        count *= int(extent)
    itemsize = int(interface["typestr"][2:])
    return int(interface["data"][0]), count * itemsize


def read_verified_to_device(
    path: StrPath,
    device_buffer: Any,
    *,
    blake3_digest: str | None = None,
    chunk_blake3: str | None = None,
    sha256: str | None = None,
    use_kvikio: bool | None = None,
) -> int:
    """Fill `device_buffer` with the file at `path`, checked (module docstring); returns the file's
    size. `use_kvikio`: None picks kvikio where it is installed; False takes the pinned ring."""
    check_expected(sha256, blake3_digest)
    address, capacity = device_pointer(device_buffer)
    size = os.stat(path).st_size
    if capacity < size:
        raise ValueError(f"{path}: {size} bytes do not fit a device buffer of {capacity}")
    chunks = decode(chunk_blake3) if blake3_digest is not None and chunk_blake3 else None
    kvikio_wanted = use_kvikio is not False and blake3_digest is not None and _kvikio() is not None
    if kvikio_wanted and _through_kvikio(path, device_buffer, size, str(blake3_digest), chunks, chunk_blake3):
        return size
    if chunks is not None:
        _PinnedRing(path, address, size, chunks).run()
    else:
        _host_then_copy(path, address, size, blake3_digest, sha256)
    return size


def _kvikio() -> Any:
    """kvikio, its thread pool sized to this host's cores unless KVIKIO_NTHREADS says otherwise (its
    default of one thread reads at a fraction of the bus), or None where it is not installed."""
    try:
        import kvikio
        import kvikio.defaults
    except ImportError:
        return None
    cores = os.cpu_count() or 1
    if "KVIKIO_NTHREADS" not in os.environ and kvikio.defaults.get("num_threads") < cores:
        kvikio.defaults.set("num_threads", cores)
    return kvikio


def _cupy() -> Any:
    try:
        import cupy
    except ImportError as err:
        raise BackendUnavailableError(f"a device read needs CuPy: {GPU_EXTRA_HINT}") from err
    return cupy


def _through_kvikio(
    path: StrPath,
    device_buffer: Any,
    size: int,
    blake3_digest: str,
    chunks: ChunkDigests | None,
    chunk_blake3: str | None,
) -> bool:
    """kvikio reads the file to the device. With chunk digests (in pieces the kernels take) the GPU
    then hashes the device's bytes (`core.gpublake3`): what is checked is what the runtime gets.
    Without them this thread hashes the file where it lies meanwhile, under a read lease. False
    where that needs a lease and none can be had or it broke (the caller takes the ring); raises
    IntegrityCheckError on a mismatch."""
    from enginecache.core import gpublake3

    kvikio = _kvikio()
    name = os.fspath(path)
    if chunks is not None and _gpu_hashable(chunks.chunk_bytes):
        ranges = chunks.ranges(size)
        with kvikio.CuFile(path, "r") as source:
            read = source.pread(device_buffer, size, 0).get()
        if read != size:
            raise IntegrityCheckError(f"{path}: kvikio read {read} of {size} bytes")
        found = gpublake3.device_chunk_digests(device_pointer(device_buffer)[0], size, chunks.chunk_bytes)
        for index, (start, end) in enumerate(ranges):
            chunks.check_digest(name, index, found[index], end - start)
        return True
    lease = take_read_lease(name)
    if lease is None:
        return False
    with lease:
        with kvikio.CuFile(lease.path, "r") as source:
            future = source.pread(device_buffer, size, 0)
            try:
                verify_file(lease.path, blake3_digest=blake3_digest, chunk_blake3=chunk_blake3, name=name)
            finally:
                read = future.get()  # never leave kvikio writing into a buffer the caller may free
        if read != size:
            raise IntegrityCheckError(f"{path}: kvikio read {read} of {size} bytes")
        return lease.intact()


def _gpu_hashable(chunk_bytes: int) -> bool:
    from enginecache.core.gpublake3 import check_piece_size

    try:
        check_piece_size(chunk_bytes)
    except ValueError:
        return False
    return True


class _PinnedRing:
    """One thread per core, each with one pinned chunk buffer and one stream: read a chunk, check
    it, copy it to its place on the device; the buffer is reused once its copy finished."""

    def __init__(self, path: StrPath, address: int, size: int, chunks: ChunkDigests) -> None:
        self._cupy = _cupy()
        self._path, self._address, self._chunks = path, address, chunks
        self._ranges = chunks.ranges(size)
        self._next = iter(range(len(self._ranges)))
        self._errors: list[tuple[int, BaseException]] = []
        self._device = self._cupy.cuda.runtime.getDevice()

    def _work(self, fd: int) -> None:
        cupy = self._cupy
        try:
            cupy.cuda.runtime.setDevice(self._device)
            pinned = cupy.cuda.alloc_pinned_memory(self._chunks.chunk_bytes)
            stream = cupy.cuda.Stream(non_blocking=True)
            staging = memoryview(pinned).cast("B")
        except BaseException as err:  # noqa: BLE001 - not swallowed: run() raises it in the calling thread
            self._errors.append((-1, err))
            return
        for index in self._next:
            if self._errors:
                break
            start, end = self._ranges[index]
            try:
                stream.synchronize()  # the previous chunk's copy is done with the staging buffer
                length = end - start
                pread_exactly(self._path, fd, staging[:length], start)
                self._chunks.check(os.fspath(self._path), index, staging[:length])
                cupy.cuda.runtime.memcpyAsync(self._address + start, pinned.ptr, length, H2D, stream.ptr)
            except BaseException as err:  # noqa: BLE001 - not swallowed: run() raises it in the calling thread
                self._errors.append((index, err))
                break
        stream.synchronize()

    def run(self) -> None:
        fd = os.open(self._path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            workers = max(1, min(os.cpu_count() or 1, len(self._ranges)))
            helpers = [threading.Thread(target=self._work, args=(fd,), name="device_read") for _ in range(workers - 1)]
            for helper in helpers:
                helper.start()
            try:
                self._work(fd)
            finally:
                for helper in helpers:
                    helper.join()
            if not self._errors and os.pread(fd, 1, self._ranges[-1][1] if self._ranges else 0):
                raise IntegrityCheckError(f"{self._path}: file grew while reading")
        finally:
            os.close(fd)
        if self._errors:
            raise min(self._errors, key=lambda found: found[0])[1]


def _host_then_copy(path: StrPath, address: int, size: int, blake3_digest: str | None, sha256: str | None) -> None:
    """A row without chunk digests: the verified read into host memory, then one copy."""
    cupy = _cupy()
    data = read_verified(path, blake3_digest=blake3_digest, sha256=sha256)
    if size:
        import ctypes

        source = ctypes.addressof(ctypes.c_char.from_buffer(data))
        cupy.cuda.runtime.memcpy(address, source, size, H2D)
