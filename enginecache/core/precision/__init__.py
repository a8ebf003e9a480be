"""Precision recipes: turn an fp32 ONNX model into its fp16/bf16/int8/fp8 variant.

TensorRT 11 (and TensorRT for RTX) is strongly typed: the precision lives in the ONNX graph,
not in builder flags. So each precision is a recipe that rewrites the ONNX file:

- fp32: no conversion; the source is used as is.
- fp16: NVIDIA ModelOpt AutoCast (`modelopt.onnx.autocast.convert_to_mixed_precision`, which
  keeps type-sensitive nodes in fp32) when it is importable, else onnxconverter-common's
  `float16.convert_float_to_float16` (light, but it breaks some graphs, e.g. Llama's rotary
  embedding: validation then says to install the modelopt extra).
- bf16: AutoCast only.
- int8 / fp8: explicit Q/DQ through `onnxruntime.quantization.quantize_static` (QDQ format,
  symmetric activations and weights, bias left in float: TensorRT's parser rejects INT32 bias
  DequantizeLinear). fp8 uses E4M3FN and the Distribution calibrator. Calibration data is an
  `.npz` (see `core.calibration`) or, without one, seeded random inputs plus a warning.

Every converted model is validated (ONNX checker, strict shape inference, an ONNX Runtime CPU
session) before it is returned. The result carries a JSON-safe recipe for the cache key.

ModelOpt (which imports torch), onnxruntime and onnxconverter-common are imported lazily, inside
the functions that use them.

Package layout: `spec` (what is asked for), `recipes` (run a recipe, or name it for the cache key),
`floatcast` (fp16/bf16), `quantize` (int8/fp8), `check` (validate a converted model), `modelfiles`
(load and save with external data), `availability` (which converters import here).
"""

from enginecache.core.calibration import load_calibration
from enginecache.core.precision.availability import modelopt_available
from enginecache.core.precision.check import validate_model
from enginecache.core.precision.recipes import convert_precision, plan_recipe
from enginecache.core.precision.spec import CONVERTERS, MODELOPT_HINT, PRECISIONS, PrecisionResult, PrecisionSpec

__all__ = [
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
