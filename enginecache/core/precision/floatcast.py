"""fp16 and bf16: NVIDIA ModelOpt AutoCast where installed, onnxconverter-common's light path.

fp16 with no converter named tries AutoCast first where the `modelopt` extra is installed, then the
light path (`lightfp16`); each result is validated before the next is tried, so a graph one
converter breaks can still come out of the other. bf16 is AutoCast only. A failure names the
converter, the stage and the node (and its op), and its hint names only what has not been tried.

AutoCast runs its fp32 reference (which decides what stays fp32) on generated inputs at the build's
profile opt shapes, written as one .npz per batch: left to itself it feeds 1 to every dynamic dim,
which a reflect Pad or a strided conv of a fully dynamic image input cannot run.
"""

from __future__ import annotations

import logging
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from enginecache.core.calibration import random_batches, read_model_inputs, resolve_shapes, save_batches
from enginecache.core.precision import availability
from enginecache.core.precision.check import run_check, validate_model
from enginecache.core.precision.lightfp16 import convert_light_fp16
from enginecache.core.precision.modelfiles import (
    captured_output,
    converter_failure,
    load_model,
    needs_external_data,
    recipe_record,
    remove_model,
    save_model,
    stage_source,
    tool_version,
)
from enginecache.core.precision.spec import (
    AUTOCAST_RULES,
    MODELOPT_HINT,
    TOOL_AUTOCAST,
    PrecisionSpec,
)
from enginecache.errors import PrecisionError

logger = logging.getLogger(__name__)

AUTOCAST_BATCHES = 1
"""Reference batches for AutoCast (each keeps every intermediate tensor of the model in memory)."""

NAMES = {"modelopt": "NVIDIA ModelOpt AutoCast", "onnxconverter": "onnxconverter-common"}


def float_converters(spec: PrecisionSpec) -> tuple[str, ...]:
    """The converters `spec` tries, in order (known before running: part of the recipe identity)."""
    if spec.precision == "bf16":
        return ("modelopt",)
    if spec.converter is not None:
        return (spec.converter,)
    return ("modelopt", "onnxconverter") if availability.modelopt_available() else ("onnxconverter",)


def convert_float(
    source: Path,
    spec: PrecisionSpec,
    target: Path,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> tuple[dict[str, object], list[str]]:
    """Convert and validate; (recipe, notes). Raises PrecisionError when every converter failed."""
    converters = float_converters(spec)
    if "modelopt" in converters and not availability.modelopt_available():
        if spec.precision == "bf16":
            raise PrecisionError(availability.missing_tool("bf16", spec.backend_family) or MODELOPT_HINT)
        raise PrecisionError(f"fp16 with converter 'modelopt' needs NVIDIA ModelOpt; {MODELOPT_HINT}")
    notes: list[str] = []
    failures: list[str] = []
    for converter in converters:
        try:
            if converter == "modelopt":
                recipe = _autocast(source, spec.precision, target, input_shapes)
                converted_notes: list[str] = []
            else:
                recipe, converted_notes = convert_light_fp16(source, target, input_shapes)
            converted_notes += validate_model(target, converter=NAMES[converter])
            converted_notes += run_check(source, target, input_shapes, converter=NAMES[converter])
        except PrecisionError as err:
            remove_model(target)
            failures.append(str(err))
            logger.warning("%s", err)
            continue
        if failures:
            notes.append(f"{spec.precision}: {failures[0]}; converted with {NAMES[converter]} instead")
        return recipe, notes + converted_notes
    raise PrecisionError("; then ".join(failures) + "; " + _hint(spec, converters))


def _hint(spec: PrecisionSpec, tried: tuple[str, ...]) -> str:
    """What is left to try: never a converter that just failed."""
    if spec.precision == "bf16":
        return "bf16 converts only through AutoCast: build this model at fp16 or fp32"
    if "modelopt" not in tried:
        if availability.modelopt_available():
            return "try converter='modelopt' (NVIDIA ModelOpt AutoCast keeps type-sensitive nodes in fp32)"
        return f"{MODELOPT_HINT} (NVIDIA ModelOpt AutoCast keeps type-sensitive nodes in fp32), or build at fp32"
    if "onnxconverter" not in tried:
        return "try converter='onnxconverter' (onnxconverter-common, with its fp32 block list), or build at fp32"
    return "no fp16 converter here handles this graph: build it at fp32"


def table_gathers(path: Path) -> list[str]:
    """Named Gathers that look rows up in a float initializer within fp16's range (embeddings).

    AutoCast's range rule (|x| <= 512 on every input and output in the reference run) also reads a
    Gather's integer indices: with token ids drawn across the vocabulary (as `core.inputs` draws
    them) it kept BERT's 8192x256 word embedding in fp32 and the engine grew from 15 to 19 MB. A
    Gather copies rows, so only the table's own values decide whether fp16 holds them."""
    import numpy as np
    import onnx

    model = load_model(path)
    tables: set[str] = set()
    limit = float(np.finfo(np.float16).max)
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT and len(init.dims) >= 2:
            values = onnx.numpy_helper.to_array(init)
            if values.size and float(np.abs(values).max()) < limit:
                tables.add(init.name)
    gathers = (node for node in model.graph.node if node.op_type == "Gather" and node.name)
    return [node.name for node in gathers if node.input[0] in tables]


def _import_autocast() -> Callable[..., Any]:
    try:
        with captured_output("ModelOpt import"):
            from modelopt.onnx.autocast import convert_to_mixed_precision
    except ImportError as err:
        raise PrecisionError(f"NVIDIA ModelOpt AutoCast does not import: {err}; {MODELOPT_HINT}") from err
    return convert_to_mixed_precision  # type: ignore[no-any-return]


def _autocast(
    source: Path, precision: str, target: Path, input_shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, object]:
    autocast = _import_autocast()
    inputs = read_model_inputs(source)
    shapes = resolve_shapes(inputs, input_shapes)
    feeds = random_batches(inputs, input_shapes, batches=AUTOCAST_BATCHES, model=source)
    folder = save_batches(feeds, target.parent / f"{target.stem}.autocast-reference")
    staged = stage_source(source, target.parent / f"{target.stem}.autocast-source")
    include = [f"^{re.escape(name)}$" for name in table_gathers(staged)]
    options: dict[str, object] = {
        "nodes_to_include": len(include),
        "low_precision_type": precision,
        "keep_io_types": True,
        "providers": ["cpu"],
        "reference_shapes": {name: list(shape) for name, shape in shapes.items()},
        "rules": AUTOCAST_RULES,
    }
    failed = f"NVIDIA ModelOpt AutoCast failed to convert {source.name} to {precision}"
    try:
        with converter_failure(failed), captured_output("ModelOpt AutoCast"):
            model = autocast(
                onnx_path=str(staged),
                low_precision_type=precision,
                keep_io_types=True,
                calibration_data=str(folder),
                nodes_to_include=include or None,
                providers=["cpu"],
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(staged.parent, ignore_errors=True)
    save_model(model, target, external=needs_external_data(source, model))
    return recipe_record(precision, TOOL_AUTOCAST, tool_version("nvidia-modelopt"), options)
