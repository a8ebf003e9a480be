"""What a conversion is asked for (`PrecisionSpec`) and what it produced (`PrecisionResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enginecache.errors import PrecisionError

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "fp8")
CONVERTERS: tuple[str, ...] = ("modelopt", "onnxconverter")
QUANTIZED: tuple[str, ...] = ("int8", "fp8")
BACKEND_FAMILIES: tuple[str, ...] = ("tensorrt", "ort")
"""Who consumes the converted model: "tensorrt" (TensorRT and TensorRT for RTX, strongly typed:
Q/DQ placed by NVIDIA ModelOpt's ONNX PTQ) or "ort" (ONNX Runtime: onnxruntime.quantization)."""

MODELOPT_EXTRA = "pip install 'enginecache[modelopt]'"
MODELOPT_HINT = f"install the modelopt extra: {MODELOPT_EXTRA}"

TOOL_NONE = "none"
TOOL_AUTOCAST = "modelopt.autocast"
TOOL_ONNXCONVERTER = "onnxconverter_common.float16"
TOOL_ORT_QUANT = "onnxruntime.quantization"
TOOL_MODELOPT_PTQ = "modelopt.onnx.quantization"

LIGHT_FP16_RULES = 2
"""Revision of the onnxconverter-common fp16 recipe (block list and graph repairs, see
`lightfp16`): part of the recipe identity, so a changed recipe is a cache miss, not a reuse."""
ORT_QUANT_RULES = 2
"""Revision of the onnxruntime.quantization recipe (2: a model below opset 13 is upgraded first,
so the Q/DQ nodes it writes are valid in the ORT-format engine): a changed recipe is a miss."""
AUTOCAST_RULES = 2
"""Revision of the AutoCast recipe (2: reference data at the build's profile shapes)."""


@dataclass(frozen=True)
class PrecisionSpec:
    """What to convert to: a precision, calibration data (int8/fp8), the fp16 converter, the
    backend family the result is for, and how the source is already quantized (None: a float
    model; a model already quantized builds only as is, at fp32)."""

    precision: str
    calibration: Path | None = None
    converter: str | None = None
    backend_family: str = "tensorrt"
    source_quantized: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise PrecisionError(f"unknown precision '{self.precision}'; choose one of {', '.join(PRECISIONS)}")
        if self.backend_family not in BACKEND_FAMILIES:
            raise PrecisionError(
                f"unknown backend family '{self.backend_family}'; choose one of {', '.join(BACKEND_FAMILIES)}"
            )
        if self.converter is not None:
            if self.converter not in CONVERTERS:
                raise PrecisionError(f"unknown converter '{self.converter}'; choose one of {', '.join(CONVERTERS)}")
            if self.precision == "bf16" and self.converter != "modelopt":
                raise PrecisionError("bf16 converts only through NVIDIA ModelOpt AutoCast")
            if self.precision not in ("fp16", "bf16"):
                raise PrecisionError(f"converter '{self.converter}' applies to fp16 only, not {self.precision}")
        if self.calibration is not None and self.precision not in QUANTIZED:
            raise PrecisionError(f"calibration data applies to int8/fp8 only, not {self.precision}")
        if self.source_quantized and self.precision != "fp32":
            raise PrecisionError(quantized_refusal(self.precision, self.source_quantized))


def quantized_refusal(precision: str, how: str) -> str:
    """Why an already-quantized model is not converted to `precision`."""
    verb = "re-quantize" if precision in QUANTIZED else "convert"
    return (
        f"the model is already quantized: {how}; enginecache does not {verb} it to {precision} "
        "(its scales and integer weights would be quantized or cast a second time); "
        "build it as is with precision fp32, which keeps its own quantization"
    )


@dataclass(frozen=True)
class PrecisionResult:
    """The converted model, how it was made, and what the caller should know about it."""

    path: Path
    converted: bool
    recipe: dict[str, object]
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
