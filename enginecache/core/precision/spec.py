"""What a conversion is asked for (`PrecisionSpec`) and what it produced (`PrecisionResult`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from enginecache.errors import PrecisionError

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "fp8")
CONVERTERS: tuple[str, ...] = ("modelopt", "onnxconverter")
QUANTIZED: tuple[str, ...] = ("int8", "fp8")

MODELOPT_HINT = "install the modelopt extra: pip install 'enginecache[modelopt]'"

TOOL_NONE = "none"
TOOL_AUTOCAST = "modelopt.autocast"
TOOL_ONNXCONVERTER = "onnxconverter_common.float16"
TOOL_ORT_QUANT = "onnxruntime.quantization"


@dataclass(frozen=True)
class PrecisionSpec:
    """What to convert to: a precision, calibration data (int8/fp8) and the fp16 converter."""

    precision: str
    calibration: Path | None = None
    converter: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise PrecisionError(f"unknown precision '{self.precision}'; choose one of {', '.join(PRECISIONS)}")
        if self.converter is not None:
            if self.converter not in CONVERTERS:
                raise PrecisionError(f"unknown converter '{self.converter}'; choose one of {', '.join(CONVERTERS)}")
            if self.precision == "bf16" and self.converter != "modelopt":
                raise PrecisionError("bf16 converts only through NVIDIA ModelOpt AutoCast")
            if self.precision not in ("fp16", "bf16"):
                raise PrecisionError(f"converter '{self.converter}' applies to fp16 only, not {self.precision}")
        if self.calibration is not None and self.precision not in QUANTIZED:
            raise PrecisionError(f"calibration data applies to int8/fp8 only, not {self.precision}")


@dataclass(frozen=True)
class PrecisionResult:
    """The converted model, how it was made, and what the caller should know about it."""

    path: Path
    converted: bool
    recipe: dict[str, object]
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
