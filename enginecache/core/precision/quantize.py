"""int8 and fp8 for the ONNX Runtime backend: explicit Q/DQ through onnxruntime.quantization,
calibrated from an .npz or generated inputs (TensorRT backends quantize with ModelOpt: `ptq`)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from enginecache.core.calibration import (
    BatchReader,
    batch_arrays,
    count_samples,
    load_calibration,
    random_batches,
    read_model_inputs,
    resolve_shapes,
)
from enginecache.core.hashing import sha256_file
from enginecache.core.precision.modelfiles import (
    needs_external_data,
    recipe_record,
    remove_model,
    save_model,
    stage_source,
    tool_version,
    trim,
)
from enginecache.core.precision.spec import TOOL_ORT_QUANT, PrecisionSpec
from enginecache.errors import PrecisionError

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
    try:
        converted = version_converter.convert_version(model, opset)
    except Exception as err:  # the converter raises RuntimeError, ValueError and onnx's own errors
        raise PrecisionError(
            f"onnx.version_converter could not move {model_path.name} from opset {current} to {opset}, "
            f"which int8 Q/DQ for ONNX Runtime needs: {type(err).__name__}: {trim(str(err))}"
        ) from err
    save_model(converted, model_path, external=needs_external_data(model_path, converted))
    return int(current)


def quantize_ort(
    source: Path,
    spec: PrecisionSpec,
    target: Path,
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[dict[str, object], list[str], str]:
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    notes: list[str] = []
    inputs = read_model_inputs(source)
    options: dict[str, object]
    if spec.calibration is not None:
        arrays = load_calibration(spec.calibration, inputs)
        feeds = batch_arrays(arrays, inputs)
        calibration: str = "npz"
        digest: str | None = sha256_file(spec.calibration)
        options = {}
    else:
        feeds = random_batches(inputs, input_shapes, model=source)
        calibration = "random"
        digest = None
        shapes = resolve_shapes(inputs, input_shapes)
        options = {"random_shapes": {name: list(shape) for name, shape in shapes.items()}}
        notes.append(f"uncalibrated: {spec.precision} scales come from random inputs; pass --calib FILE.npz")

    if spec.precision == "int8":
        activation, weight, method = (
            QuantType.QInt8,
            QuantType.QInt8,
            CalibrationMethod.MinMax,
        )
    else:
        activation = weight = QuantType.QFLOAT8E4M3FN
        method = CalibrationMethod.Distribution
    extra = {
        "ActivationSymmetric": True,
        "WeightSymmetric": True,
        "QuantizeBias": False,
    }
    external = needs_external_data(source, None)
    options.update(
        {
            "quant_format": "QDQ",
            "activation_type": activation.name,
            "weight_type": weight.name,
            "calibrate_method": method.name,
            "per_channel": False,
            "extra_options": dict(extra),
            "batches": len(feeds),
            # No quant_pre_process: its ORT graph optimizations fold constants that the quantizer
            # then turns into quantized constants TensorRT rejects ("Quantized constant ... is only
            # allowed before DQ", seen on bert_mini and tiny_llama); without it every reference
            # model builds.
            "pre_process": False,
        }
    )

    staged = stage_source(source, target.parent / f"{target.stem}.quant-source")
    try:
        upgraded = upgrade_opset(staged, QDQ_MIN_OPSET)
        if upgraded is not None:
            notes.append(f"opset {upgraded} -> {QDQ_MIN_OPSET} before quantizing (onnx.version_converter)")
            options["opset_upgraded_from"] = upgraded
        quantize_static(
            str(staged),
            str(target),
            BatchReader(feeds),
            quant_format=QuantFormat.QDQ,
            activation_type=activation,
            weight_type=weight,
            per_channel=False,
            calibrate_method=method,
            use_external_data_format=external,
            calibration_providers=["CPUExecutionProvider"],
            extra_options=extra,
        )
    except Exception as err:  # ORT raises ValueError, RuntimeError and its own pybind errors
        remove_model(target)
        raise PrecisionError(
            f"onnxruntime.quantization failed to quantize {source.name} to {spec.precision}: "
            f"{type(err).__name__}: {trim(str(err))}"
        ) from err
    finally:
        shutil.rmtree(staged.parent, ignore_errors=True)

    recipe = recipe_record(spec.precision, TOOL_ORT_QUANT, tool_version("onnxruntime"), options)
    recipe["calibration"] = calibration
    recipe["calibration_digest"] = digest
    recipe["calibration_samples"] = count_samples(feeds)
    return recipe, notes, ""
