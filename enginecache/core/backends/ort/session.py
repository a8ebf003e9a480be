"""An ORT-format optimized model run by ONNX Runtime on the CPU, from the verified bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from enginecache.core.backends.loadtypes import LoadSpec, PhaseTimer, TensorIO
from enginecache.core.backends.ort.dtypes import ort_dtype, ort_shape
from enginecache.core.backends.ort.errors import ort_errors
from enginecache.errors import InferenceError, LoadFailedError

if TYPE_CHECKING:  # the contract (`base`: dataclasses) stays out of a cache hit
    from types import ModuleType

    from enginecache.core.backends.base import Feeds


def _as_bytes(buffer: bytes | bytearray | memoryview) -> bytes:
    return buffer if isinstance(buffer, bytes) else bytes(buffer)


def session_io(session: Any) -> tuple[TensorIO, ...]:
    """Inputs then outputs of an `onnxruntime.InferenceSession`, in our dtype names."""
    return tuple(
        [TensorIO(t.name, "input", ort_dtype(t.type), ort_shape(t.shape)) for t in session.get_inputs()]
        + [TensorIO(t.name, "output", ort_dtype(t.type), ort_shape(t.shape)) for t in session.get_outputs()]
    )


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
            except ort_errors(ort) as err:
                raise LoadFailedError(f"ONNX Runtime could not load {spec.label}: {err}") from err
        self.io = session_io(self._session)
        self._outputs = [t.name for t in self.io if t.mode == "output"]
        self._errors = ort_errors(ort)

    @property
    def raw(self) -> Any:
        """The `onnxruntime.InferenceSession`."""
        return self._session

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        try:
            values = self._session.run(self._outputs, dict(feeds))
        except self._errors as err:
            raise InferenceError(f"ONNX Runtime inference failed: {err}") from err
        return {name: np.asarray(value) for name, value in zip(self._outputs, values, strict=True)}

    def close(self) -> None:
        self._session = None
        self._bytes = b""
