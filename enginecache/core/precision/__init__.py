"""Precision recipes: turn an fp32 ONNX model into its fp16/bf16/int8/fp8 variant.

TensorRT 11 (and TensorRT for RTX) is strongly typed: the precision lives in the ONNX graph,
not in builder flags. So each precision is a recipe that rewrites the ONNX file, chosen by the
precision and, for int8/fp8, by the backend family the result is for (`PrecisionSpec.backend_family`):

- fp32: no conversion; the source is used as is (the only precision an already-quantized model
  takes: `onnx_quantized.quantization` says how it is quantized, and other precisions are refused).
- fp16: NVIDIA ModelOpt AutoCast (`modelopt.onnx.autocast.convert_to_mixed_precision`, which
  keeps type-sensitive nodes in fp32, with reference inputs at the build's profile shapes) where
  the `modelopt` extra is installed, then onnxconverter-common's `convert_float_to_float16` with a
  block list and graph repairs (`lightfp16`), each validated before the next is tried.
- bf16: AutoCast only.
- int8 / fp8 for TensorRT ("tensorrt"): NVIDIA ModelOpt's ONNX PTQ
  (`modelopt.onnx.quantization.quantize`, `ptq`), the Q/DQ placement strongly typed TensorRT
  expects; it imports torch, so it needs the `modelopt` extra.
- int8 / fp8 for ONNX Runtime ("ort"): `onnxruntime.quantization.quantize_static` (`quantize`:
  QDQ, symmetric, bias left in float; fp8 E4M3FN with the Distribution calibrator).

A model that also lists initializers among its graph inputs (IR < 4 style, `core.onnx_initinputs`)
is converted from a copy without them (`modelfiles.converter_source`), with a note saying so.

Calibration data is an `.npz` (see `core.calibration`) or, without one, generated inputs at the
profile's opt shapes plus an "uncalibrated" warning. Every converted model is validated (ONNX
checker, strict shape inference, an ONNX Runtime CPU session) before it is returned. The result
carries a JSON-safe recipe; `plan_recipe` names a recipe before running it (the cache key's part).

ModelOpt (which imports torch), onnxruntime and onnxconverter-common are imported lazily, inside
the functions that use them.

Package layout: `spec` (what is asked for), `recipes` (run a recipe, or name it for the cache key),
`floatcast` (fp16/bf16 dispatch and AutoCast), `lightfp16` (onnxconverter-common's fp16),
`fp16repair` (the graph repairs that conversion needs), `ptq` (int8/fp8 with ModelOpt), `quantize`
(int8/fp8 with onnxruntime.quantization), `check` (validate a converted model), `modelfiles` (load,
save, stage with external data; converter failures in our words), `availability` (which converters
import here). Calibration feeds for int8/fp8 come from `core.calibration`.
"""

from enginecache.core.calibration import load_calibration
from enginecache.core.precision.availability import modelopt_available
from enginecache.core.precision.check import validate_model
from enginecache.core.precision.recipes import convert_precision, plan_recipe
from enginecache.core.precision.spec import (
    BACKEND_FAMILIES,
    CONVERTERS,
    MODELOPT_HINT,
    PRECISIONS,
    PrecisionResult,
    PrecisionSpec,
)

__all__ = [
    "BACKEND_FAMILIES",
    "CONVERTERS",
    "MODELOPT_HINT",
    "PRECISIONS",
    "PrecisionResult",
    "PrecisionSpec",
    "convert_precision",
    "load_calibration",
    "modelopt_available",
    "plan_recipe",
    "validate_model",
]
