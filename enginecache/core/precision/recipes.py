"""Run a precision recipe (`convert_precision`) and name it before running (`plan_recipe`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from enginecache.core.hashing import sha256_file
from enginecache.core.precision import availability
from enginecache.core.precision.check import validate_model
from enginecache.core.precision.floatcast import convert_float
from enginecache.core.precision.modelfiles import recipe_record, remove_model, tool_version
from enginecache.core.precision.quantize import quantize
from enginecache.core.precision.spec import (
    TOOL_AUTOCAST,
    TOOL_NONE,
    TOOL_ONNXCONVERTER,
    TOOL_ORT_QUANT,
    PrecisionResult,
    PrecisionSpec,
)
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

    `input_shapes` (the optimization profile's opt shapes) size the random calibration feeds
    when int8/fp8 runs without a calibration file. Raises `PrecisionError` (or its subclass
    `CalibrationError`) when the conversion fails or its result does not validate.
    """
    source = Path(source)
    if not source.is_file():
        raise PrecisionError(f"source model {source} does not exist")
    if spec.precision == "fp32":
        return PrecisionResult(path=source, converted=False, recipe=recipe_record("fp32", TOOL_NONE, None, {}))
    workdir.mkdir(parents=True, exist_ok=True)
    target = workdir / f"{source.stem}.{spec.precision}.onnx"
    started = time.perf_counter()
    if spec.precision in ("fp16", "bf16"):
        recipe, notes, hint = convert_float(source, spec, target)
    else:
        recipe, notes, hint = quantize(source, spec, target, input_shapes)
    try:
        notes += validate_model(target, converter_hint=hint)
    except PrecisionError:
        remove_model(target)
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
            "modelopt" if availability.modelopt_available() or spec.precision == "bf16" else "onnxconverter"
        )
        if converter == "modelopt":
            return {**identity, "tool": TOOL_AUTOCAST, "tool_version": tool_version("nvidia-modelopt")}
        return {**identity, "tool": TOOL_ONNXCONVERTER, "tool_version": tool_version("onnxconverter-common")}
    if spec.calibration is not None:
        identity.update(calibration="npz", calibration_digest=sha256_file(spec.calibration))
    else:
        shapes = {name: list(shape) for name, shape in sorted((input_shapes or {}).items())}
        identity.update(calibration="random", random_shapes=shapes)
    return {**identity, "tool": TOOL_ORT_QUANT, "tool_version": tool_version("onnxruntime")}
