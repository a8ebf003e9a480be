"""Whether a backend can build an already-quantized model as is, decided when a build is planned, so
the advice a refusal gives ("build it as is at fp32") is only given where a backend can follow it.

A quantized model builds only as is (`core.precision`); for the TensorRT family that also needs a
quantization TensorRT's parser reads (`core.onnx_quantized.tensorrt_unreadable`: Q/DQ of signed
symmetric types, as ModelOpt writes). Where it cannot, a TensorRT-family plan of the model, at any
precision, is refused naming why and the backends that do build it as is; the model's file is read
once per digest in a process (a planning dashboard redraws its matrix every few seconds)."""

from __future__ import annotations

import threading

from enginecache.core.backends.base import Backend
from enginecache.core.backends.registry import all_backends
from enginecache.core.onnx_quantized import tensorrt_unreadable_file
from enginecache.db.models import ModelRecord
from enginecache.errors import PrecisionError
from enginecache.service.context import AppContext
from enginecache.service.models.register import model_path

_UNREADABLE: dict[str, str | None] = {}  # model digest -> why TensorRT cannot read its quantization
_LOCK = threading.Lock()


def refuse_unbuildable_quantized(app: AppContext, model: ModelRecord, backend: Backend) -> None:
    """Raise PrecisionError (exit 2) where `model` is already quantized in a way `backend` cannot
    build as is; a float model, or one the backend reads, passes."""
    if not model.info.get("quantized") or backend.precision_family != "tensorrt":
        return
    why = tensorrt_unreadable(app, model)
    if why is None:
        return
    others = " or ".join(f"{b.label} (backend {b.name})" for b in all_backends() if b.precision_family != "tensorrt")
    raise PrecisionError(
        f"{backend.label} cannot build this already-quantized model as is: {why}; "
        f"build it as is at fp32 with {others}, which runs its quantization as it is "
        "(enginecache does not convert or re-quantize an already-quantized model)"
    )


def tensorrt_unreadable(app: AppContext, model: ModelRecord) -> str | None:
    """Why TensorRT cannot read the model's quantization, or None (read once per digest)."""
    with _LOCK:
        if model.digest in _UNREADABLE:
            return _UNREADABLE[model.digest]
    why = tensorrt_unreadable_file(model_path(app, model))
    with _LOCK:
        _UNREADABLE[model.digest] = why
    return why
