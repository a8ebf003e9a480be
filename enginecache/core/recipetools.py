"""What a precision recipe's identity reads of this environment, named once.

`core.precision.recipes.plan_recipe` (the recipe part of the cache key) records the exact version of
one of `RECIPE_TOOLS` for every converter or quantizer it plans, and the fp16/bf16 converters it tries
depend on whether NVIDIA ModelOpt AutoCast can be imported (`modelopt_importable`, asked of
`MODELOPT_MODULES`; `core.precision.availability.modelopt_available` is this). The serving memo
(`service.serving.memo`) keys by `recipe_environment()`, the same names asked the same way, so a
change of any of them is another memo and never a stale answer.

Imports no part of `core.precision` (its package imports onnx): a cache hit reads this module.
"""

from __future__ import annotations

from enginecache.core.distributions import distribution_version
from enginecache.core.lazyimport import importable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

ONNXRUNTIME = "onnxruntime"  # onnxruntime.quantization: int8/fp8 for the ORT backend
ONNXCONVERTER = "onnxconverter-common"  # the light fp16 converter
MODELOPT = "nvidia-modelopt"  # AutoCast (fp16/bf16) and ONNX PTQ (int8/fp8 for TensorRT backends)
RECIPE_TOOLS = (ONNXRUNTIME, ONNXCONVERTER, MODELOPT)
MODELOPT_MODULES = ("modelopt", "torch", "onnx_graphsurgeon")  # what AutoCast imports


def modelopt_importable() -> bool:
    """Whether ModelOpt AutoCast can be imported here (asked without importing it or torch)."""
    return all(importable(name) for name in MODELOPT_MODULES)


def recipe_environment() -> dict[str, Any]:
    """Every fact of this environment a recipe's identity may depend on: each tool's version (None where
    it is not installed) and whether ModelOpt can be imported."""
    return {
        "tools": {name: distribution_version(name) for name in RECIPE_TOOLS},
        "modelopt_importable": modelopt_importable(),
    }
