"""Which converters can run here, found without importing them (ModelOpt imports torch), and so
which precisions this install can make (`missing_tool`): the one answer planning, the converters and
the dashboard's build form give."""

from __future__ import annotations

from enginecache.core.precision.spec import MODELOPT_EXTRA, QUANTIZED
from enginecache.core.recipetools import MODELOPT_MODULES as MODELOPT_MODULES  # re-exported
from enginecache.core.recipetools import modelopt_importable


def modelopt_available() -> bool:
    """Whether ModelOpt AutoCast can be imported here (checked without importing it or torch):
    `core.recipetools.modelopt_importable`, which the serving memo keys by."""
    return modelopt_importable()


def missing_tool(precision: str, backend_family: str) -> str | None:
    """Why this install cannot make `precision` for a backend of `backend_family`, naming the extra
    that would, or None where it can: bf16 converts only through ModelOpt AutoCast (every family),
    int8 and fp8 for the TensorRT family quantize only through ModelOpt's ONNX PTQ (the ORT family's
    onnxruntime.quantization is always installed); fp32 and fp16 need no extra."""
    if modelopt_available():
        return None
    if precision == "bf16":
        return f"bf16 needs NVIDIA ModelOpt AutoCast: {MODELOPT_EXTRA}"
    if precision in QUANTIZED and backend_family == "tensorrt":
        return (
            f"{precision} for a TensorRT backend quantizes with NVIDIA ModelOpt's ONNX PTQ "
            f"(modelopt.onnx.quantization, which imports torch), not installed here: {MODELOPT_EXTRA}"
        )
    return None
