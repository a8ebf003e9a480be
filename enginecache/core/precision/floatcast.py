"""fp16 and bf16: NVIDIA ModelOpt AutoCast where installed, else onnxconverter-common (fp16 only)."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enginecache.core.precision import availability
from enginecache.core.precision.modelfiles import (
    load_model,
    needs_external_data,
    recipe_record,
    save_model,
    tool_version,
    trim,
)
from enginecache.core.precision.spec import MODELOPT_HINT, TOOL_AUTOCAST, TOOL_ONNXCONVERTER, PrecisionSpec
from enginecache.errors import PrecisionError

logger = logging.getLogger(__name__)


def convert_float(source: Path, spec: PrecisionSpec, target: Path) -> tuple[dict[str, object], list[str], str]:
    notes: list[str] = []
    converter = spec.converter
    if spec.precision == "bf16":
        if not availability.modelopt_available():
            raise PrecisionError("bf16 needs NVIDIA ModelOpt AutoCast: pip install 'enginecache[modelopt]'")
        converter = "modelopt"
    elif converter == "modelopt" and not availability.modelopt_available():
        raise PrecisionError(f"fp16 with converter 'modelopt' needs NVIDIA ModelOpt; {MODELOPT_HINT}")
    elif converter is None:
        converter = "modelopt" if availability.modelopt_available() else "onnxconverter"

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
        if availability.modelopt_available()
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
            f"ModelOpt AutoCast failed to convert {source.name} to {precision}: {type(err).__name__}: {trim(str(err))}"
        ) from err
    save_model(model, target, external=needs_external_data(source, model))
    return recipe_record(precision, TOOL_AUTOCAST, tool_version("nvidia-modelopt"), options)


def _onnxconverter_fp16(source: Path, target: Path) -> tuple[dict[str, object], list[str]]:
    from onnxconverter_common import float16

    options: dict[str, object] = {
        "keep_io_types": True,
        "min_positive_val": 1e-7,
        "max_finite_val": 1e4,
    }
    model = load_model(source)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            converted = float16.convert_float_to_float16(
                model, min_positive_val=1e-7, max_finite_val=1e4, keep_io_types=True
            )
        except Exception as err:  # the converter raises plain ValueError/RuntimeError/onnx errors
            raise PrecisionError(
                f"onnxconverter-common failed to convert {source.name} to fp16: {type(err).__name__}: {trim(str(err))}"
            ) from err
    clamped = sum(1 for w in caught if "will be truncated to" in str(w.message))
    notes = []
    if clamped:
        notes.append(
            f"fp16: onnxconverter-common clamped {clamped} float32 values into [1e-7, 1e4] (magnitude) to fit fp16"
        )
    save_model(converted, target, external=needs_external_data(source, converted))
    return recipe_record("fp16", TOOL_ONNXCONVERTER, tool_version("onnxconverter-common"), options), notes
