"""Loaded engines: one small session protocol (`infer`, `close`) over ONNX Runtime and TensorRT.

A session is made from the engine bytes already read (and verified) into memory, never from a
path, so the bytes that were hashed are the bytes that run. Each load phase (validity check,
deserialize, execution context, I/O allocation) is timed into a `PhaseTimer`.

TensorRT sessions use the TensorRT 10 API only (`num_io_tensors`, `get_tensor_name`,
`set_input_shape`, `set_tensor_address`, `execute_async_v3`) with device memory from
`core.cuda`; they need a GPU and are imported lazily.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from core.backends.base import TensorIO
from core.errors import CoreError

logger = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]


class LoadError(CoreError):
    """An engine could not be loaded (deserialize, context, allocation); carries the backend's words."""


class IncompatibleEngineError(LoadError):
    """The backend's own validity check refuses the engine on this host (its diagnostic in `details`)."""

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = dict(details or {})


class InferenceError(CoreError):
    """Inference failed (bad feeds, or the backend refused them)."""


@dataclass
class PhaseTimer:
    """Seconds per named phase, in the order they ran (a phase run twice adds up)."""

    phases: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self.phases[name] = self.phases.get(name, 0.0) + time.perf_counter() - started

    def total(self) -> float:
        return sum(self.phases.values())


@dataclass(frozen=True)
class LoadSpec:
    """How to load: the shapes to prepare I/O for (the profile's opt shapes by default)."""

    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    label: str = "engine"
    backend_version: str | None = None  # the version that built it (checked where the format is tied to it)
    targets: tuple[str, ...] = ()


class EngineSession(Protocol):
    """A loaded engine, ready to run."""

    backend: str
    io: tuple[TensorIO, ...]

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run once; returns every output by name as host numpy arrays."""
        ...

    def close(self) -> None:
        """Release the session (device memory, contexts)."""
        ...


def _as_bytes(buffer: bytes | bytearray | memoryview) -> bytes:
    return buffer if isinstance(buffer, bytes) else bytes(buffer)


class OrtEngineSession:
    """An ORT-format optimized model run by ONNX Runtime on the CPU."""

    backend = "ort"

    def __init__(self, ort: ModuleType, buffer: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer):
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # ORT's Python binding takes `bytes` only; with this entry it runs from those bytes without
        # another copy (we keep them alive on the session).
        options.add_session_config_entry("session.use_ort_model_bytes_directly", "1")
        options.add_session_config_entry("session.load_model_format", "ORT")
        with timer.phase("deserialize"):
            self._bytes = _as_bytes(buffer)
            try:
                self._session = ort.InferenceSession(self._bytes, options, providers=["CPUExecutionProvider"])
            except (RuntimeError, ValueError) as err:  # ORT raises subclasses of these
                raise LoadError(f"ONNX Runtime could not load {spec.label}: {err}") from err
        from core.backends.ort import _shape, ort_dtype

        self.io = tuple(
            [TensorIO(t.name, "input", ort_dtype(t.type), _shape(t.shape)) for t in self._session.get_inputs()]
            + [TensorIO(t.name, "output", ort_dtype(t.type), _shape(t.shape)) for t in self._session.get_outputs()]
        )
        self._outputs = [t.name for t in self.io if t.mode == "output"]

    @property
    def raw(self) -> Any:
        """The `onnxruntime.InferenceSession`."""
        return self._session

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        try:
            values = self._session.run(self._outputs, dict(feeds))
        except (RuntimeError, ValueError) as err:
            raise InferenceError(f"ONNX Runtime inference failed: {err}") from err
        return {name: np.asarray(value) for name, value in zip(self._outputs, values, strict=True)}

    def close(self) -> None:
        self._session = None
        self._bytes = b""


def _numpy_dtype(name: str) -> np.dtype[Any]:
    return np.dtype("bool" if name == "bool" else name)


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
        from core import cuda
        from core.backends.trt import dtype_name

        self.backend = backend
        self._cuda = cuda
        self._buffers: dict[str, Any] = {}
        self._stream: Any = None
        with timer.phase("deserialize"):
            self.engine = runtime.deserialize_cuda_engine(buffer)
        if self.engine is None:
            raise LoadError(f"{spec.label}: deserialize failed: " + "; ".join(_error_lines(log_lines)))
        with timer.phase("create_context"):
            self.context = self.engine.create_execution_context()
        if self.context is None:
            raise LoadError(f"{spec.label}: no execution context: " + "; ".join(_error_lines(log_lines)))
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        io: list[TensorIO] = []
        with timer.phase("allocate_io"):
            try:
                self._stream = cuda.Stream()
                for name in names:
                    is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
                    wanted = spec.input_shapes.get(name) if is_input else None
                    if wanted is not None and not self.context.set_input_shape(name, tuple(wanted)):
                        raise LoadError(f"{spec.label}: input {name} refuses shape {spec.input_shapes[name]}")
                for name in names:
                    is_input = self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
                    dtype = dtype_name(self.engine.get_tensor_dtype(name))
                    shape = tuple(int(d) for d in self.context.get_tensor_shape(name))
                    if any(d < 0 for d in shape):
                        raise LoadError(f"{spec.label}: tensor {name} has unresolved shape {shape}; give input shapes")
                    nbytes = int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(dtype).itemsize
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
            host = np.ascontiguousarray(feeds[tensor.name], dtype=_numpy_dtype(tensor.dtype))
            if tuple(host.shape) != tuple(self.context.get_tensor_shape(tensor.name)) and not (
                self.context.set_input_shape(tensor.name, host.shape)
            ):
                raise InferenceError(f"input {tensor.name} refuses shape {host.shape}")
            self._ensure_capacity(tensor.name, host.nbytes).copy_from_host(host, stream)
        for tensor in self.io:  # outputs may have grown with the input shapes: size them before running
            if tensor.mode == "output":
                shape = tuple(int(d) for d in self.context.get_tensor_shape(tensor.name))
                nbytes = int(np.prod(shape, dtype=np.int64)) * _numpy_dtype(tensor.dtype).itemsize
                self._ensure_capacity(tensor.name, nbytes)
        if not self.context.execute_async_v3(stream.handle):
            raise InferenceError("execute_async_v3 failed (see the TensorRT log)")
        for tensor in self.io:
            if tensor.mode == "output":
                shape = tuple(int(d) for d in self.context.get_tensor_shape(tensor.name))
                host_out = np.empty(shape, dtype=_numpy_dtype(tensor.dtype))
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
