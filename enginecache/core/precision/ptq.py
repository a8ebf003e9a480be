"""int8 and fp8 for TensorRT: NVIDIA ModelOpt's ONNX post-training quantization.

`modelopt.onnx.quantization.quantize` places Q/DQ the way strongly typed TensorRT expects it
(weights quantized by a DequantizeLinear of an initializer, activations by Q/DQ pairs on the
inputs of the ops TensorRT runs in int8/fp8, ops TensorRT keeps in float left alone). On published
float models TensorRT for RTX built its graphs where the graphs of onnxruntime.quantization were
refused ("Quantized constant ... is only allowed before DQ", a Myelin reshape error).

Calibration: the user's `.npz` (checked and batched by `core.calibration`), else generated feeds at
the build's profile opt shapes with the "uncalibrated" warning. Calibration runs on ONNX Runtime's
CPU provider; the rest of the graph stays fp32 (`high_precision_dtype="fp32"`). ModelOpt imports
torch, so this is the `modelopt` extra.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx

from enginecache.core.calibration import BatchReader, calibration_feeds
from enginecache.core.precision import availability
from enginecache.core.precision.modelfiles import (
    Quantized,
    captured_output,
    converter_failure,
    needs_external_data,
    recipe_record,
    remove_model,
    staged_copy,
    tool_version,
)
from enginecache.core.precision.spec import MODELOPT_EXTRA, TOOL_MODELOPT_PTQ, PrecisionSpec
from enginecache.errors import PrecisionError

logger = logging.getLogger(__name__)

CALIBRATION_METHOD = "entropy"
"""ModelOpt's default for int8 and fp8 (the other choice is "max")."""


def ptq_unavailable(precision: str) -> PrecisionError:
    """ModelOpt's ONNX PTQ is not installed here (`availability.missing_tool`'s words, or the extra
    named where it found ModelOpt importable but the quantizer failed to import)."""
    return PrecisionError(
        availability.missing_tool(precision, "tensorrt")
        or f"{precision} for a TensorRT backend quantizes with NVIDIA ModelOpt's ONNX PTQ "
        f"(modelopt.onnx.quantization), which does not import here: {MODELOPT_EXTRA}"
    )


def quantize_modelopt(
    source: Path, spec: PrecisionSpec, target: Path, input_shapes: Mapping[str, Sequence[int]] | None
) -> Quantized:
    """Quantize `source` into `target`; (recipe, notes, hint for a validation failure)."""
    calib = calibration_feeds(source, spec.calibration, spec.precision, input_shapes)
    notes, options = list(calib.notes), dict(calib.options)

    if not availability.modelopt_available():
        raise ptq_unavailable(spec.precision)
    quantize = _import_quantize(spec.precision)
    external = needs_external_data(source, None)
    # What ModelOpt's quantize is given, recorded in the recipe as given (a copy: ModelOpt may edit
    # its calibration_eps list in place, putting "trt" first for a model with custom ops).
    settings: dict[str, Any] = {
        "quantize_mode": spec.precision,
        "calibration_method": CALIBRATION_METHOD,
        "calibration_eps": ["cpu"],
        "high_precision_dtype": "fp32",
    }
    options.update({**copy.deepcopy(settings), "batches": len(calib.feeds)})
    # The source lives in the artifact store: ModelOpt writes intermediate files beside its input.
    with staged_copy(source, target.parent / f"{target.stem}.ptq-source") as staged:
        remove_model(target)
        failed = f"NVIDIA ModelOpt's ONNX PTQ failed to quantize {source.name} to {spec.precision}"
        with converter_failure(failed, target), captured_output("ModelOpt PTQ"), ort_quantization_restored():
            quantize(
                str(staged),
                calibration_data_reader=BatchReader(calib.feeds),
                use_external_data_format=external,
                output_path=str(target),
                log_level="WARNING",
                **settings,
            )
    if not target.is_file():
        raise PrecisionError(f"NVIDIA ModelOpt's ONNX PTQ wrote no model for {source.name} ({spec.precision})")

    pairs = _count_qdq(target)
    if pairs == 0:
        notes.append(
            f"{spec.precision}: ModelOpt placed no Q/DQ nodes in {source.name} (no op it quantizes for TensorRT "
            "qualifies, e.g. convolutions with few channels or GEMMs smaller than 16); the engine runs in fp32"
        )
    options["qdq_nodes"] = pairs
    recipe = recipe_record(spec.precision, TOOL_MODELOPT_PTQ, tool_version("nvidia-modelopt"), options)
    recipe.update(calib.record())
    hint = (
        "ModelOpt's quantized graph does not validate; build this model at fp32 or fp16, "
        "or pass --calib with real inputs"
    )
    return recipe, notes, hint


def _import_quantize(precision: str) -> Callable[..., Any]:
    try:
        with captured_output("ModelOpt import"):
            from modelopt.onnx.quantization import quantize
    except ImportError as err:
        raise PrecisionError(f"{ptq_unavailable(precision)} ({err})") from err
    return quantize  # type: ignore[no-any-return]


def _count_qdq(path: Path) -> int:
    model = onnx.load(str(path), load_external_data=False)
    return sum(1 for node in model.graph.node if node.op_type in ("QuantizeLinear", "DequantizeLinear"))


@contextlib.contextmanager
def ort_quantization_restored() -> Iterator[None]:
    """Undo what ModelOpt's PTQ changes in onnxruntime.quantization: it patches calibrator and
    quantizer methods and adds ops to the QDQ registry process-wide (`ort_patching.patch_ort_modules`,
    `ort_utils.configure_ort`), after which `quantize_static` for the ONNX Runtime backend fails in
    the same process ("Quantization parameters are not specified for param ...")."""
    modules = [m for name, m in sorted(sys.modules.items()) if name.startswith("onnxruntime.quantization") and m]
    saved = [(module, _snapshot(module)) for module in modules]
    try:
        yield
    finally:
        for module, (attributes, dicts, classes) in saved:
            for name, value in attributes.items():
                if module.__dict__.get(name) is not value:
                    setattr(module, name, value)
            for table, items in dicts:
                table.clear()
                table.update(items)
            for cls, members in classes:
                for name in set(vars(cls)) - set(members):
                    with contextlib.suppress(AttributeError, TypeError):
                        delattr(cls, name)
                for name, value in members.items():
                    if vars(cls).get(name) is not value:
                        with contextlib.suppress(AttributeError, TypeError):
                            setattr(cls, name, value)


_Tables = list[tuple[dict[object, object], dict[object, object]]]
_Snapshot = tuple[dict[str, object], _Tables, list[tuple[type, dict[str, object]]]]


def _snapshot(module: ModuleType) -> _Snapshot:
    attributes = dict(vars(module))
    dicts = [(value, dict(value)) for value in attributes.values() if type(value) is dict]
    classes = [
        (value, dict(vars(value)))
        for value in attributes.values()
        if isinstance(value, type) and value.__module__ == module.__name__
    ]
    return attributes, dicts, classes
