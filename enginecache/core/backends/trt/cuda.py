"""The one place that touches device memory: cuda-python's `cuda.bindings.runtime`.

Imported lazily (importing `core` never loads a GPU library). Every call's error code is
checked and turned into a `CudaError` with the runtime's own name for it.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from enginecache.core.lazyimport import import_backend
from enginecache.errors import CudaError


def cudart() -> ModuleType:
    """`cuda.bindings.runtime`, or BackendUnavailableError with the install hint."""
    import_backend("cuda.bindings")
    return import_backend("cuda.bindings.runtime")


def check(call: str, result: Any) -> Any:
    """cuda-python returns `(err, *values)`: raise on a non-zero err, else return the values."""
    values = result if isinstance(result, tuple) else (result,)
    err, rest = values[0], values[1:]
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise CudaError(f"{call} failed: {name} ({int(err)})")
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


class Stream:
    """A CUDA stream (created on the current device)."""

    def __init__(self) -> None:
        self._rt = cudart()
        self.handle: Any = check("cudaStreamCreate", self._rt.cudaStreamCreate())

    def synchronize(self) -> None:
        check("cudaStreamSynchronize", self._rt.cudaStreamSynchronize(self.handle))

    def close(self) -> None:
        if self.handle is not None:
            check("cudaStreamDestroy", self._rt.cudaStreamDestroy(self.handle))
            self.handle = None


class DeviceBuffer:
    """`nbytes` of device memory; `ptr` is the integer address TensorRT's set_tensor_address takes."""

    def __init__(self, nbytes: int) -> None:
        self._rt = cudart()
        self.nbytes = max(1, int(nbytes))
        self.ptr: int = int(check("cudaMalloc", self._rt.cudaMalloc(self.nbytes)))

    def copy_from_host(self, host: Any, stream: Stream) -> None:
        """Asynchronous host -> device copy of a C-contiguous numpy array (no larger than the buffer)."""
        size = int(host.nbytes)
        if size > self.nbytes:
            raise CudaError(f"host array of {size} bytes does not fit a device buffer of {self.nbytes}")
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        check("cudaMemcpyAsync", self._rt.cudaMemcpyAsync(self.ptr, host.ctypes.data, size, kind, stream.handle))

    def copy_to_host(self, host: Any, stream: Stream) -> None:
        """Asynchronous device -> host copy into a C-contiguous numpy array."""
        size = int(host.nbytes)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        check("cudaMemcpyAsync", self._rt.cudaMemcpyAsync(host.ctypes.data, self.ptr, size, kind, stream.handle))

    def free(self) -> None:
        if self.ptr:
            check("cudaFree", self._rt.cudaFree(self.ptr))
            self.ptr = 0
