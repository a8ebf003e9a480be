"""int8 and fp8 for the ONNX Runtime backend: explicit Q/DQ through onnxruntime.quantization,
calibrated from an .npz or generated inputs (TensorRT backends quantize with ModelOpt: `ptq`)."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from enginecache.core.calibration import BatchReader, calibration_feeds
from enginecache.core.precision.modelfiles import (
    Quantized,
    converter_failure,
    needs_external_data,
    recipe_record,
    save_model,
    staged_copy,
    tool_version,
)
from enginecache.core.precision.spec import TOOL_ORT_QUANT, PrecisionSpec

# The opset whose QuantizeLinear/DequantizeLinear take `axis`: onnxruntime.quantization writes
# Q/DQ nodes with it whatever the model's opset, and ORT's ORT-format reader then refuses an
# opset-10/11 graph ("Unrecognized attribute: axis for operator DequantizeLinear": ppocr_cls,
# ppocr_det), while the .onnx it came from loads. Upgrading first gives an engine that loads.
QDQ_MIN_OPSET = 13


def upgrade_opset(model_path: Path, opset: int) -> int | None:
    """Rewrite the (staged) model at `opset` where its default-domain opset is lower; the opset it
    had, else None. A model the converter cannot move is a PrecisionError naming the converter."""
    import onnx
    from onnx import version_converter

    model = onnx.load(str(model_path))
    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), opset)
    if current >= opset:
        return None
    failed = (
        f"onnx.version_converter could not move {model_path.name} from opset {current} to {opset}, "
        "which int8 Q/DQ for ONNX Runtime needs"
    )
    with converter_failure(failed):  # the converter raises RuntimeError, ValueError and onnx's own errors
        converted = version_converter.convert_version(model, opset)
    save_model(converted, model_path, external=needs_external_data(model_path, converted))
    return int(current)


def quantize_ort(
    source: Path, spec: PrecisionSpec, target: Path, input_shapes: Mapping[str, Sequence[int]] | None
) -> Quantized:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    calib = calibration_feeds(source, spec.calibration, spec.precision, input_shapes)
    notes, options = list(calib.notes), dict(calib.options)

    if spec.precision == "int8":
        activation, weight, method = (
            QuantType.QInt8,
            QuantType.QInt8,
            CalibrationMethod.MinMax,
        )
    else:
        activation = weight = QuantType.QFLOAT8E4M3FN
        method = CalibrationMethod.Distribution
    # What quantize_static is given, recorded in the recipe as given.
    settings: dict[str, Any] = {
        "quant_format": QuantFormat.QDQ,
        "activation_type": activation,
        "weight_type": weight,
        "calibrate_method": method,
        "per_channel": False,
        "extra_options": {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
    }
    recorded = copy.deepcopy(settings)  # the recipe's own copy, with the enums by name
    recorded.update((name, value.name) for name, value in settings.items() if isinstance(value, Enum))
    external = needs_external_data(source, None)
    options.update(
        {
            **recorded,
            "batches": len(calib.feeds),
            # No quant_pre_process: its ORT graph optimizations fold constants that the quantizer
            # then turns into quantized constants TensorRT rejects ("Quantized constant ... is only
            # allowed before DQ", seen on bert_mini and tiny_llama); without it every reference
            # model builds.
            "pre_process": False,
        }
    )

    failed = f"onnxruntime.quantization failed to quantize {source.name} to {spec.precision}"
    with (
        staged_copy(source, target.parent / f"{target.stem}.quant-source") as staged,
        converter_failure(failed, target),  # ORT raises ValueError, RuntimeError and its own pybind errors
    ):
        upgraded = upgrade_opset(staged, QDQ_MIN_OPSET)
        if upgraded is not None:
            notes.append(f"opset {upgraded} -> {QDQ_MIN_OPSET} before quantizing (onnx.version_converter)")
            options["opset_upgraded_from"] = upgraded
        quantize_static(
            str(staged),
            str(target),
            BatchReader(calib.feeds),
            use_external_data_format=external,
            calibration_providers=["CPUExecutionProvider"],
            **settings,
        )

    recipe = recipe_record(spec.precision, TOOL_ORT_QUANT, tool_version("onnxruntime"), options)
    recipe.update(calib.record())
    return recipe, notes, ""
