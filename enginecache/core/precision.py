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
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import re
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

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
from enginecache.errors import PrecisionError

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

logger = logging.getLogger(__name__)

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16", "int8", "fp8")
CONVERTERS: tuple[str, ...] = ("modelopt", "onnxconverter")
QUANTIZED: tuple[str, ...] = ("int8", "fp8")

MODELOPT_HINT = "install the modelopt extra: pip install 'enginecache[modelopt]'"

TOOL_NONE = "none"
TOOL_AUTOCAST = "modelopt.autocast"
TOOL_ONNXCONVERTER = "onnxconverter_common.float16"
TOOL_ORT_QUANT = "onnxruntime.quantization"

# A serialized ModelProto cannot exceed 2 GiB; leave headroom for the graph itself.
_EXTERNAL_DATA_THRESHOLD = 1_800_000_000
_MAX_MESSAGE = 800


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


def modelopt_available() -> bool:
    """Whether ModelOpt AutoCast can be imported here (checked without importing it or torch)."""
    return all(importlib.util.find_spec(name) is not None for name in ("modelopt", "torch", "onnx_graphsurgeon"))


def convert_precision(
    source: Path,
    spec: PrecisionSpec,
    workdir: Path,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> PrecisionResult:
    """Convert `source` to `spec.precision`, writing `<stem>.<precision>.onnx` into `workdir`.

    `input_shapes` (the optimization profile's opt shapes) size the random calibration feeds
    when int8/fp8 runs without a calibration file. Raises `PrecisionError` (or its subclass
    `CalibrationError`) when the conversion fails or its result does not validate.
    """
    source = Path(source)
    if not source.is_file():
        raise PrecisionError(f"source model {source} does not exist")
    if spec.precision == "fp32":
        return PrecisionResult(path=source, converted=False, recipe=_recipe("fp32", TOOL_NONE, None, {}))
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / f"{source.stem}.{spec.precision}.onnx"
    started = time.perf_counter()
    if spec.precision in ("fp16", "bf16"):
        recipe, notes, hint = _convert_float(source, spec, target)
    else:
        recipe, notes, hint = _quantize(source, spec, target, input_shapes)
    try:
        notes += validate_model(target, converter_hint=hint)
    except PrecisionError:
        _remove_model(target)
        raise
    seconds = time.perf_counter() - started
    logger.info(
        "%s -> %s with %s in %.2f s (%d bytes)",
        source.name,
        spec.precision,
        recipe["tool"],
        seconds,
        target.stat().st_size,
    )
    return PrecisionResult(
        path=target,
        converted=True,
        recipe=recipe,
        warnings=tuple(notes),
        seconds=seconds,
    )


def plan_recipe(spec: PrecisionSpec, *, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, object]:
    """The identity of a conversion, known before running it: what goes into the cache key.

    A conversion is a function of the source model and of this identity (precision, tool and
    exact version, calibration data digest, random-calibration shapes), so a cache hit needs
    no conversion. The converted model's own digest is recorded on its catalog row.
    """
    identity: dict[str, object] = {"name": spec.precision, "calibration": None, "calibration_digest": None}
    if spec.precision == "fp32":
        return {**identity, "tool": TOOL_NONE, "tool_version": None}
    if spec.precision in ("fp16", "bf16"):
        converter = spec.converter or (
            "modelopt" if modelopt_available() or spec.precision == "bf16" else "onnxconverter"
        )
        if converter == "modelopt":
            return {**identity, "tool": TOOL_AUTOCAST, "tool_version": _version("nvidia-modelopt")}
        return {**identity, "tool": TOOL_ONNXCONVERTER, "tool_version": _version("onnxconverter-common")}
    if spec.calibration is not None:
        identity.update(calibration="npz", calibration_digest=sha256_file(spec.calibration))
    else:
        shapes = {name: list(shape) for name, shape in sorted((input_shapes or {}).items())}
        identity.update(calibration="random", random_shapes=shapes)
    return {**identity, "tool": TOOL_ORT_QUANT, "tool_version": _version("onnxruntime")}


# --- fp16 / bf16 ---------------------------------------------------------------------------


def _convert_float(source: Path, spec: PrecisionSpec, target: Path) -> tuple[dict[str, object], list[str], str]:
    notes: list[str] = []
    converter = spec.converter
    if spec.precision == "bf16":
        if not modelopt_available():
            raise PrecisionError("bf16 needs NVIDIA ModelOpt AutoCast: pip install 'enginecache[modelopt]'")
        converter = "modelopt"
    elif converter == "modelopt" and not modelopt_available():
        raise PrecisionError(f"fp16 with converter 'modelopt' needs NVIDIA ModelOpt; {MODELOPT_HINT}")
    elif converter is None:
        converter = "modelopt" if modelopt_available() else "onnxconverter"

    if converter == "modelopt":
        try:
            autocast = _import_autocast()
        except PrecisionError as err:
            if spec.converter is not None or spec.precision == "bf16":
                raise
            note = f"ModelOpt is installed but does not import ({err}); used onnxconverter-common"
            logger.warning(note)
            notes.append(note)
            converter = "onnxconverter"
        else:
            return _autocast(autocast, source, spec.precision, target), notes, ""
    recipe, clamp_notes = _onnxconverter_fp16(source, target)
    hint = (
        "onnxconverter-common's fp16 graph is invalid here; convert with converter='modelopt' "
        "(NVIDIA ModelOpt AutoCast keeps type-sensitive nodes in fp32)"
        if modelopt_available()
        else f"onnxconverter-common's fp16 graph is invalid here; {MODELOPT_HINT} "
        "(NVIDIA ModelOpt AutoCast keeps type-sensitive nodes in fp32)"
    )
    return recipe, notes + clamp_notes, hint


def _import_autocast() -> Callable[..., Any]:
    try:
        from modelopt.onnx.autocast import convert_to_mixed_precision
    except ImportError as err:
        raise PrecisionError(f"NVIDIA ModelOpt AutoCast does not import: {err}; {MODELOPT_HINT}") from err
    return convert_to_mixed_precision  # type: ignore[no-any-return]


def _autocast(autocast: Callable[..., Any], source: Path, precision: str, target: Path) -> dict[str, object]:
    options: dict[str, object] = {
        "low_precision_type": precision,
        "keep_io_types": True,
        "providers": ["cpu"],
    }
    try:
        model = autocast(
            onnx_path=str(source),
            low_precision_type=precision,
            keep_io_types=True,
            providers=["cpu"],
        )
    except Exception as err:  # AutoCast raises asserts, ORT and onnx errors alike
        raise PrecisionError(
            f"ModelOpt AutoCast failed to convert {source.name} to {precision}: {type(err).__name__}: {_trim(str(err))}"
        ) from err
    _save_model(model, target, external=_needs_external_data(source, model))
    return _recipe(precision, TOOL_AUTOCAST, _version("nvidia-modelopt"), options)


def _onnxconverter_fp16(source: Path, target: Path) -> tuple[dict[str, object], list[str]]:
    from onnxconverter_common import float16

    options: dict[str, object] = {
        "keep_io_types": True,
        "min_positive_val": 1e-7,
        "max_finite_val": 1e4,
    }
    model = _load_model(source)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = float16.convert_float_to_float16(
                model, min_positive_val=1e-7, max_finite_val=1e4, keep_io_types=True
            )
        except Exception as err:  # the converter raises plain ValueError/RuntimeError/onnx errors
            raise PrecisionError(
                f"onnxconverter-common failed to convert {source.name} to fp16: {type(err).__name__}: {_trim(str(err))}"
            ) from err
    clamped = sum(1 for w in caught if "will be truncated to" in str(w.message))
    notes = []
    if clamped:
        notes.append(
            f"fp16: onnxconverter-common clamped {clamped} float32 values into [1e-7, 1e4] (magnitude) to fit fp16"
        )
    _save_model(converted, target, external=_needs_external_data(source, converted))
    return _recipe("fp16", TOOL_ONNXCONVERTER, _version("onnxconverter-common"), options), notes


# --- int8 / fp8 ----------------------------------------------------------------------------


def _quantize(
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
        feeds = random_batches(inputs, input_shapes)
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
    external = _needs_external_data(source, None)
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

    try:
        quantize_static(
            str(source),
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
        _remove_model(target)
        raise PrecisionError(
            f"onnxruntime.quantization failed to quantize {source.name} to {spec.precision}: "
            f"{type(err).__name__}: {_trim(str(err))}"
        ) from err

    recipe = _recipe(spec.precision, TOOL_ORT_QUANT, _version("onnxruntime"), options)
    recipe["calibration"] = calibration
    recipe["calibration_digest"] = digest
    recipe["calibration_samples"] = count_samples(feeds)
    return recipe, notes, ""


# --- validation ----------------------------------------------------------------------------


def validate_model(path: Path, *, converter_hint: str = "") -> tuple[str, ...]:
    """Check a model with the ONNX checker (path-based, so external data and >2 GB models
    work), strict shape inference and an ONNX Runtime CPU session.

    Raises `PrecisionError` naming the failing stage, the node when the message names one,
    and `converter_hint` (what to install or use instead). Returns notes for checks that
    could not run here: an ONNX Runtime CPU build has no kernel for some low-precision ops
    (e.g. bf16 Conv); such a graph has passed ORT's type checks, so it is not an error.
    """
    path = Path(path)
    if not path.is_file():
        raise PrecisionError(f"model {path} does not exist")
    try:
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, OSError, ValueError, DecodeError) as err:
        raise _invalid(path, "ONNX checker", err, converter_hint) from err
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
        raise _invalid(path, "ONNX shape inference", err, converter_hint) from err
    del model

    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except ort_state.NotImplemented as err:
        note = f"onnxruntime CPU cannot run {path.name} (graph types check out): {_trim(_strip_ort(str(err)), 300)}"
        logger.info(note)
        return (note,)
    except (
        ort_state.Fail,
        ort_state.InvalidGraph,
        ort_state.InvalidArgument,
        ort_state.InvalidProtobuf,
        ort_state.RuntimeException,
        ort_state.NoSuchFile,
        ort_state.EPFail,
    ) as err:
        raise _invalid(path, "onnxruntime session", err, converter_hint) from err
    del session
    return ()


def _invalid(path: Path, stage: str, err: BaseException, hint: str) -> PrecisionError:
    message = _strip_ort(str(err))
    node = _node_in_message(message, path)
    where = f" at node '{node}'" if node else ""
    text = f"{path.name} is not a valid model: {stage} failed{where}: {_trim(message)}"
    if hint:
        text += f"; {hint}"
    return PrecisionError(text)


_NODE_PATTERNS = (
    re.compile(r"node name: ([^\s),]+)"),
    re.compile(r"[Nn]ode \(([^)]+)\)"),
    re.compile(r"[Nn]ode with name '([^']+)'"),
    re.compile(r"with name '([^']+)'"),
    re.compile(r"(?:^|[\s:])(/[^\s:()'\"]+):"),
    re.compile(r"[Nn]ode:? '?([^\s',]+)'?"),
)


def _node_in_message(message: str, path: Path) -> str | None:
    """The graph node a checker/ORT message names, confirmed against the model's node names."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, ValueError, DecodeError):
        return None
    names = {node.name for node in model.graph.node if node.name}
    for pattern in _NODE_PATTERNS:
        for match in pattern.finditer(message):
            if match.group(1) in names:
                return match.group(1)
    found = [name for name in names if len(name) >= 4 and name in message]
    return max(found, key=len) if found else None


def _strip_ort(message: str) -> str:
    """Drop ONNX Runtime's '[ONNXRuntimeError] : 1 : FAIL : Load model from X failed:' prefix,
    keep the first of onnx's per-node inference errors, and name element types."""
    entries = re.findall(r"\(op_type:.*?(?=\(op_type:|$)", message, flags=re.S)
    if len(entries) > 1:
        prefix = message[: message.index("(op_type:")].strip()
        message = f"{prefix} {entries[0].strip()} (and {len(entries) - 1} more node errors)"
    message = re.sub(
        r"\((\d+)\) vs \((\d+)\)",
        lambda m: f"({_type_name(int(m.group(1)))}) vs ({_type_name(int(m.group(2)))})",
        message,
    )
    return re.sub(
        r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from \S+ failed:)?",
        "",
        message,
    ).strip()


def _type_name(elem_type: int) -> str:
    try:
        return str(onnx.TensorProto.DataType.Name(elem_type)).lower()
    except ValueError:
        return str(elem_type)


# --- helpers -------------------------------------------------------------------------------


def _recipe(name: str, tool: str, version: str | None, options: dict[str, object]) -> dict[str, object]:
    return {
        "name": name,
        "tool": tool,
        "tool_version": version,
        "options": options,
        "calibration": None,
        "calibration_digest": None,
        "calibration_samples": None,
    }


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _load_model(source: Path) -> onnx.ModelProto:
    try:
        return onnx.load(str(source))
    except (OSError, ValueError, DecodeError) as err:
        raise PrecisionError(f"cannot load {source}: {err}") from err


def _needs_external_data(source: Path, model: onnx.ModelProto | None) -> bool:
    """Whether the output must keep weights outside the protobuf (source did, or >2 GB)."""
    if source.stat().st_size > _EXTERNAL_DATA_THRESHOLD:
        return True
    if model is not None and model.ByteSize() > _EXTERNAL_DATA_THRESHOLD:
        return True
    header = onnx.load(str(source), load_external_data=False)
    return any(init.data_location == onnx.TensorProto.EXTERNAL for init in header.graph.initializer)


def _save_model(model: onnx.ModelProto, target: Path, *, external: bool) -> None:
    _remove_model(target)
    try:
        if external:
            onnx.save(
                model,
                str(target),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=target.name + ".data",
            )
        else:
            onnx.save(model, str(target))
    except (OSError, ValueError) as err:
        raise PrecisionError(f"cannot write {target}: {err}") from err


def _remove_model(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.with_name(path.name + ".data").unlink(missing_ok=True)


def _trim(text: str, limit: int = _MAX_MESSAGE) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
