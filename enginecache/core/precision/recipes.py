"""Run a precision recipe (`convert_precision`) and name it before running (`plan_recipe`).

Which recipe runs depends on the precision and, for int8/fp8, on the backend family
(`PrecisionSpec.backend_family`): TensorRT backends quantize with NVIDIA ModelOpt's ONNX PTQ
(`ptq`), the ONNX Runtime backend with onnxruntime.quantization (`quantize`). fp16/bf16 recipes
are the same for every backend (`floatcast`), so one converted variant serves them all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from enginecache.core.hashing import sha256_file
from enginecache.core.precision import availability
from enginecache.core.precision.check import run_check, validate_model
from enginecache.core.precision.floatcast import convert_float, float_converters
from enginecache.core.precision.modelfiles import (
    converter_source,
    recipe_record,
    remove_model,
    source_quantization,
    tool_version,
)
from enginecache.core.precision.ptq import quantize_modelopt
from enginecache.core.precision.quantize import quantize_ort
from enginecache.core.precision.spec import (
    AUTOCAST_RULES,
    LIGHT_FP16_RULES,
    ORT_QUANT_RULES,
    TOOL_AUTOCAST,
    TOOL_MODELOPT_PTQ,
    TOOL_NONE,
    TOOL_ONNXCONVERTER,
    TOOL_ORT_QUANT,
    PrecisionResult,
    PrecisionSpec,
    quantized_refusal,
)
from enginecache.core.recipetools import MODELOPT, ONNXCONVERTER, ONNXRUNTIME
from enginecache.errors import PrecisionError

logger = logging.getLogger(__name__)


def convert_precision(
    source: Path,
    spec: PrecisionSpec,
    workdir: Path,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> PrecisionResult:
    """Convert `source` to `spec.precision`, writing `<stem>.<precision>.onnx` into `workdir`.

    `input_shapes` (the optimization profile's opt shapes) size the generated calibration feeds
    when int8/fp8 runs without a calibration file, and AutoCast's reference inputs. Raises
    `PrecisionError` (or its subclass `CalibrationError`) when the source is already quantized,
    when the conversion fails, or when its result does not validate.
    """
    source = Path(source)
    if not source.is_file():
        raise PrecisionError(f"source model {source} does not exist")
    if spec.precision == "fp32":
        return PrecisionResult(path=source, converted=False, recipe=recipe_record("fp32", TOOL_NONE, None, {}))
    how = spec.source_quantized or source_quantization(source)
    if how:
        raise PrecisionError(f"{source.name}: {quantized_refusal(spec.precision, how)}")
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / f"{source.stem}.{spec.precision}.onnx"
    started = time.perf_counter()
    with converter_source(source, workdir / f"{source.stem}.converter-source") as (converted_from, notes):
        recipe, converted_notes = _convert(converted_from, spec, target, input_shapes)
    notes = notes + converted_notes
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


def _convert(
    source: Path, spec: PrecisionSpec, target: Path, input_shapes: Mapping[str, Sequence[int]] | None
) -> tuple[dict[str, object], list[str]]:
    """Convert `source` into `target` with the recipe `spec` names, validated; (recipe, notes)."""
    if spec.precision in ("fp16", "bf16"):
        return convert_float(source, spec, target, input_shapes)
    if spec.backend_family == "tensorrt":
        recipe, notes, hint = quantize_modelopt(source, spec, target, input_shapes)
        made_by = "NVIDIA ModelOpt's ONNX PTQ"
    else:
        recipe, notes, hint = quantize_ort(source, spec, target, input_shapes)
        made_by = "onnxruntime.quantization"
    recipe["backend_family"] = spec.backend_family
    try:
        notes += validate_model(target, converter_hint=hint, converter=made_by)
        notes += run_check(source, target, input_shapes, converter_hint=hint, converter=made_by)
    except PrecisionError:
        remove_model(target)
        raise
    return recipe, notes


def plan_recipe(spec: PrecisionSpec, *, input_shapes: Mapping[str, Sequence[int]] | None = None) -> dict[str, object]:
    """The identity of a conversion, known before running it: what goes into the cache key.

    A conversion is a function of the source model and of this identity, so a cache hit needs
    no conversion:

    - fp32: no tool.
    - fp16/bf16: the converters tried, in order, each with its exact version and rules revision;
      AutoCast also with the shapes of its reference inputs (the profile's opt shapes). The same
      for every backend.
    - int8/fp8: the backend family ("tensorrt": ModelOpt's ONNX PTQ, "ort":
      onnxruntime.quantization), the tool and exact version, and the calibration (the .npz's
      digest, or "random" with the shapes of the generated feeds).

    A precision this install cannot make (`availability.missing_tool`: bf16, or int8/fp8 for the
    TensorRT family, without ModelOpt) raises PrecisionError naming the extra, so a build of it is
    refused when planned, as the build form and the CLI plan it, not in its job.

    Every tool version recorded is one of `core.recipetools.RECIPE_TOOLS`, and the converters tried
    follow `modelopt_available()`: the environment the serving memo keys by. The converted model's own
    digest is recorded on its catalog row.
    """
    identity: dict[str, object] = {"name": spec.precision, "calibration": None, "calibration_digest": None}
    shapes = {name: list(shape) for name, shape in sorted((input_shapes or {}).items())}
    if spec.precision == "fp32":
        return {**identity, "tool": TOOL_NONE, "tool_version": None}
    missing = availability.missing_tool(spec.precision, spec.backend_family)
    if missing is not None:  # refused before submit, not in the job: the worker is this install
        raise PrecisionError(missing)
    if spec.precision in ("fp16", "bf16"):
        converters: list[dict[str, object]] = []
        for converter in float_converters(spec):
            if converter == "modelopt":
                converters.append(
                    {
                        "tool": TOOL_AUTOCAST,
                        "tool_version": tool_version(MODELOPT),
                        "rules": AUTOCAST_RULES,
                        "reference_shapes": shapes,
                    }
                )
            else:
                converters.append(
                    {
                        "tool": TOOL_ONNXCONVERTER,
                        "tool_version": tool_version(ONNXCONVERTER),
                        "rules": LIGHT_FP16_RULES,
                    }
                )
        first = converters[0]
        return {**identity, "tool": first["tool"], "tool_version": first["tool_version"], "converters": converters}
    if spec.calibration is not None:
        identity.update(calibration="npz", calibration_digest=sha256_file(spec.calibration))
    else:
        identity.update(calibration="random", random_shapes=shapes)
    if spec.backend_family == "tensorrt":
        tool, version = TOOL_MODELOPT_PTQ, tool_version(MODELOPT)
    else:
        tool, version = TOOL_ORT_QUANT, tool_version(ONNXRUNTIME)
        identity["rules"] = ORT_QUANT_RULES
    return {**identity, "backend_family": spec.backend_family, "tool": tool, "tool_version": version}
