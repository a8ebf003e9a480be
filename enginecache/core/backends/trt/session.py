"""A TensorRT / TensorRT-RTX engine on the GPU, from the verified bytes.

TensorRT 10 API only (`num_io_tensors`, `get_tensor_name`, `set_input_shape`, `set_tensor_address`,
`execute_async_v3`) with device memory from `cuda`; it needs a GPU and its libraries are imported
lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from enginecache.core.backends.loadtypes import LoadSpec, PhaseTimer, TensorIO, numpy_dtype
from enginecache.core.backends.trt import cuda
from enginecache.core.backends.trt.dtypes import dtype_name
from enginecache.core.backends.trt.runtimecache import (
    RuntimeCacheHandOver,
    create_context,
    serialized_cache,
    supports_runtime_cache,
)
from enginecache.errors import InferenceError, LoadFailedError

if TYPE_CHECKING:  # the contract (`base`: dataclasses) stays out of a cache hit
    from types import ModuleType

    from enginecache.core.backends.base import Feeds


class TensorRTEngineSession:
    """A TensorRT / TensorRT-RTX engine on the GPU: engine, execution context, device buffers, stream.

    `engine` and `context` are the raw TensorRT objects for callers that drive them themselves.
    """

    def __init__(
        self,
        trt: ModuleType,
        runtime: Any,
        buffer: bytes | bytearray | memoryview,
        spec: LoadSpec,
        timer: PhaseTimer,
        log_lines: list[str],
        backend: str,
    ) -> None:
        self.backend = backend
        self._cuda = cuda
        self._buffers: dict[str, Any] = {}
        self._stream: Any = None
        with timer.phase("deserialize"):
            self.engine = runtime.deserialize_cuda_engine(buffer)
        if self.engine is None:
            raise LoadFailedError(f"{spec.label}: deserialize failed: " + "; ".join(_error_lines(log_lines)))
        # TensorRT-RTX: the context's runtime config carries a runtime cache (spec.runtime_cache's bytes
        # where given; core/backends/trt/runtimecache.py), so `runtime_cache_bytes()` can write it back.
        self.runtime_cache: RuntimeCacheHandOver | None = None
        with timer.phase("create_context"):
            if supports_runtime_cache(self.engine):
                self.context, self.runtime_cache = create_context(self.engine, spec.runtime_cache)
            else:
                self.context = self.engine.create_execution_context()
        if self.context is None:
            raise LoadFailedError(f"{spec.label}: no execution context: " + "; ".join(_error_lines(log_lines)))
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        io: list[TensorIO] = []
        with timer.phase("allocate_io"):
            try:
                self._stream = cuda.Stream()
                for name in names:
                    is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
                    wanted = spec.input_shapes.get(name) if is_input else None
                    if wanted is not None and not self.context.set_input_shape(name, tuple(wanted)):
                        raise LoadFailedError(f"{spec.label}: input {name} refuses shape {spec.input_shapes[name]}")
                for name in names:
                    is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
                    dtype = dtype_name(self.engine.get_tensor_dtype(name))
                    shape = tuple(int(d) for d in self.context.get_tensor_shape(name))
                    if any(d < 0 for d in shape):
                        raise LoadFailedError(
                            f"{spec.label}: tensor {name} has unresolved shape {shape}; give input shapes"
                        )
                    nbytes = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dtype).itemsize
                    device = cuda.DeviceBuffer(nbytes)
                    self._buffers[name] = device
                    self.context.set_tensor_address(name, device.ptr)
                    io.append(TensorIO(name, "input" if is_input else "output", dtype, shape))
            except BaseException:
                self.close()
                raise
        self.io = tuple(io)

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        stream = self._stream
        outputs: dict[str, np.ndarray] = {}
        for tensor in self.io:
            if tensor.mode != "input":
                continue
            if tensor.name not in feeds:
                raise InferenceError(f"missing input {tensor.name}")
            host = np.ascontiguousarray(feeds[tensor.name], dtype=numpy_dtype(tensor.dtype))
            if tuple(host.shape) != tuple(self.context.get_tensor_shape(tensor.name)) and not (
                self.context.set_input_shape(tensor.name, host.shape)
            ):
                raise InferenceError(f"input {tensor.name} refuses shape {host.shape}")
            self._ensure_capacity(tensor.name, host.nbytes).copy_from_host(host, stream)
        for tensor in self.io:  # outputs may have grown with the input shapes: size them before running
            if tensor.mode == "output":
                shape = tuple(int(d) for d in self.context.get_tensor_shape(tensor.name))
                nbytes = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(tensor.dtype).itemsize
                self._ensure_capacity(tensor.name, nbytes)
        if not self.context.execute_async_v3(stream.handle):
            raise InferenceError("execute_async_v3 failed (see the TensorRT log)")
        for tensor in self.io:
            if tensor.mode == "output":
                shape = tuple(int(d) for d in self.context.get_tensor_shape(tensor.name))
                host_out = np.empty(shape, dtype=numpy_dtype(tensor.dtype))
                self._ensure_capacity(tensor.name, host_out.nbytes).copy_to_host(host_out, stream)
                outputs[tensor.name] = host_out
        stream.synchronize()
        return outputs

    def _ensure_capacity(self, name: str, nbytes: int) -> Any:
        """The tensor's device buffer, reallocated (and re-bound) when a larger shape needs more."""
        device = self._buffers[name]
        if nbytes > device.nbytes:
            device.free()
            device = self._cuda.DeviceBuffer(nbytes)
            self._buffers[name] = device
            self.context.set_tensor_address(name, device.ptr)
        return device

    def runtime_cache_bytes(self) -> bytes | None:
        """The TensorRT-RTX runtime cache as it stands (to publish with `publish_runtime_cache`);
        None for plain TensorRT. Needs an RTX GPU."""
        return serialized_cache(self.runtime_cache) if self.runtime_cache is not None else None

    def close(self) -> None:
        for device in self._buffers.values():
            device.free()
        self._buffers.clear()
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        self.context = None
        self.engine = None


def _error_lines(lines: list[str]) -> list[str]:
    found = [line for line in lines if line.startswith(("[ERROR]", "[INTERNAL_ERROR]"))]
    return found or ["no error message from the library"]
