"""An ORT-format optimized model run by ONNX Runtime on the CPU, from the verified bytes or a verified file."""

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


def _release_model_source(session: Any) -> None:
    """Let go of what the session was made from once it exists: the engine's bytes, so a serving
    process holds the model once (ORT's tensors), not twice; or the path of a leased file, which
    names another file once the lease's descriptor is closed.

    ORT's `InferenceSession` keeps the `bytes` (or the path) it was given for as long as it lives
    ("This is bad as we're holding the memory indefinitely", its own comment), only to create the
    session again in `set_providers` or when a run fails over to its fallback providers. The session
    itself needs them no more: the binding loaded from its own copy, which is gone when the
    constructor returns, and without `session.use_ort_model_bytes_for_initializers` the
    initializers are ORT's own tensors. A CPU-only session has nothing to fall back to, so fallback
    is off and the wrapper's references are dropped (where this ORT has them by those names)."""
    session.disable_fallback()
    if isinstance(getattr(session, "_model_bytes", None), bytes):
        session._model_bytes = None
    if isinstance(getattr(session, "_model_path", None), str):
        session._model_path = None


class OrtEngineSession:
    """An ORT-format optimized model run by ONNX Runtime on the CPU."""

    backend = "ort"

    def __init__(
        self, ort: ModuleType, source: bytes | bytearray | memoryview | str, spec: LoadSpec, timer: PhaseTimer
    ):
        """`source`: the verified bytes, or the path of a file ORT reads itself (a leased store file)."""
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # ORT's Python binding takes `bytes` only and copies them into a C++ string for the load
        # (`const std::string` in onnxruntime_pybind_state.cc); with this entry ORT loads from that
        # copy rather than making one more of its own. A path ORT reads into a buffer of its own.
        options.add_session_config_entry("session.use_ort_model_bytes_directly", "1")
        options.add_session_config_entry("session.load_model_format", "ORT")  # a path's name has no .ort
        model = source if isinstance(source, str) else _as_bytes(source)
        with timer.phase("deserialize"):
            try:
                session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            except ort_errors(ort) as err:
                raise LoadFailedError(f"ONNX Runtime could not load {spec.label}: {err}") from err
        _release_model_source(session)
        self._session = session
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
