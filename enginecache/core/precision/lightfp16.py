"""fp16 without torch: onnxconverter-common's `convert_float_to_float16`, with the repairs it needs.

The converter keeps the ops of `OP_BLOCK_LIST` in fp32 (onnxconverter-common's own list: Resize,
Range, TopK, NonMaxSuppression, RoiAlign, CumSum, Min, Max, Upsample and the ML ops, plus ops
whose output type comes from a `dtype` attribute and the signal ops), wraps them in Casts and
converts everything else. Before converting, one fp32 reference run on generated inputs at the
build's profile shapes finds the nodes whose inputs or outputs exceed `DATA_MAX` and keeps them
in fp32 too (`range_blocks`, AutoCast's IORangeRule in small). On its own the converter leaves
graphs that are invalid, or that TensorRT refuses, in five ways, each fixed by `fp16repair` (its
docstring lists them).

What still fails ONNX's strict type inference, or an ONNX Runtime CPU session (Celu takes float32
only), is converted again (at most `MAX_ROUNDS` conversions) with the nodes named kept in fp32
(`node_block_list`); a node inside a subgraph keeps its top-level ancestor in fp32. The result is
validated afterwards like every converted model.
"""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from onnx import ModelProto, TensorProto

from enginecache.core.onnx_graph import subgraphs, walk
from enginecache.core.precision.fp16repair import name_nodes, nested_nodes, repair, split_shared_initializers
from enginecache.core.precision.modelfiles import (
    EXTERNAL_DATA_THRESHOLD,
    converter_failure,
    load_model,
    needs_external_data,
    recipe_record,
    save_model,
    tool_version,
    trim,
)
from enginecache.core.precision.spec import LIGHT_FP16_RULES, TOOL_ONNXCONVERTER
from enginecache.errors import EngineCacheError

logger = logging.getLogger(__name__)

CONVERTER = "onnxconverter-common"
MIN_POSITIVE = 1e-7
MAX_FINITE = 1e4
MAX_ROUNDS = 3
DATA_MAX = 8192.0
"""Magnitude past which a node's inputs or outputs keep it in fp32 (fp16's largest finite value is
65504; an eighth of it leaves room for inputs larger than the reference run's)."""
"""Conversions tried: the first with the op block list alone, then with the nodes strict type
inference names kept in fp32."""

# onnxconverter-common's DEFAULT_OP_BLOCK_LIST (1.16), spelt out so the recipe is ours to version.
_CONVERTER_DEFAULTS = (
    "ArrayFeatureExtractor",
    "Binarizer",
    "CastMap",
    "CategoryMapper",
    "DictVectorizer",
    "FeatureVectorizer",
    "Imputer",
    "LabelEncoder",
    "LinearClassifier",
    "LinearRegressor",
    "Normalizer",
    "OneHotEncoder",
    "RandomUniformLike",
    "SVMClassifier",
    "SVMRegressor",
    "Scaler",
    "TreeEnsembleClassifier",
    "TreeEnsembleRegressor",
    "ZipMap",
    "NonMaxSuppression",
    "TopK",
    "RoiAlign",
    "Resize",
    "Range",
    "CumSum",
    "Min",
    "Max",
    "Upsample",
)
# Ops whose float output type is set by a `dtype` attribute the converter does not rewrite, and the
# signal ops (STFT/DFT/windows), which ONNX Runtime's CPU provider runs in fp32 only.
_EXTRA_BLOCKS = (
    "RandomNormal",
    "RandomNormalLike",
    "RandomUniform",
    "EyeLike",
    "Multinomial",
    "Bernoulli",
    "STFT",
    "DFT",
    "MelWeightMatrix",
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
)
OP_BLOCK_LIST: tuple[str, ...] = _CONVERTER_DEFAULTS + _EXTRA_BLOCKS

_NODE_ERROR = re.compile(r"\(op_type:([^,]+), node name: ([^)]+)\)")
_ORT_NODE = re.compile(r"node \(([^)]+)\)|[Nn]ode with name '([^']+)'|[Nn]ame:'([^']+)'")


def convert_light_fp16(
    source: Path, target: Path, input_shapes: Mapping[str, Sequence[int]] | None = None
) -> tuple[dict[str, object], list[str]]:
    """Convert `source` to fp16 into `target`; (recipe, notes). `input_shapes` (the profile's opt
    shapes) size the reference run of the range check. Raises PrecisionError naming the converter,
    and the node and op where the converter itself fails."""
    model = load_model(source)
    renamed = name_nodes(model)
    casts = {node.name for node in nested_nodes(model) if node.op_type == "Cast"}
    ancestors = _top_level_ancestors(model)
    notes: list[str] = []
    out_of_range, range_note = range_blocks(model, source, input_shapes)
    if range_note:
        notes.append(range_note)
    blocked: set[str] = set(out_of_range)
    clamped = 0
    converted = model
    remaining: dict[str, str] = {}
    for _ in range(MAX_ROUNDS):
        converted, clamped = _convert(model, blocked, source)
        repair(converted, casts, set(OP_BLOCK_LIST), blocked)
        remaining = type_errors(converted)
        new = {ancestors.get(name, name) for name in remaining} - blocked
        new &= set(ancestors.values())  # top-level nodes only
        if not remaining or not new:
            break
        logger.info("fp16 (%s): keeping %d nodes in fp32 after a type error: %s", CONVERTER, len(new), sorted(new))
        blocked |= new
    if clamped:
        notes.append(
            f"fp16: {CONVERTER} clamped {clamped} float32 values into [{MIN_POSITIVE:g}, {MAX_FINITE:g}] "
            "(magnitude) to fit fp16"
        )
    if out_of_range:
        notes.append(
            f"fp16: {len(out_of_range)} nodes kept in fp32, their inputs or outputs past {DATA_MAX:g} in a "
            f"reference run: {', '.join(sorted(out_of_range)[:8])}"
        )
    typed = blocked - set(out_of_range)
    if typed:
        notes.append(f"fp16: {len(typed)} nodes kept in fp32 after type errors: {', '.join(sorted(typed)[:8])}")
    if renamed:
        logger.info("fp16 (%s): named %d unnamed nodes", CONVERTER, renamed)
    save_model(converted, target, external=needs_external_data(source, converted))
    options: dict[str, object] = {
        "keep_io_types": True,
        "min_positive_val": MIN_POSITIVE,
        "max_finite_val": MAX_FINITE,
        "op_block_list": list(OP_BLOCK_LIST),
        "node_block_list": sorted(blocked),
        "data_max": DATA_MAX,
        "rules": LIGHT_FP16_RULES,
    }
    return recipe_record("fp16", TOOL_ONNXCONVERTER, tool_version(CONVERTER), options), notes


def range_blocks(
    model: ModelProto, source: Path, input_shapes: Mapping[str, Sequence[int]] | None
) -> tuple[list[str], str]:
    """Main-graph nodes that must stay fp32 because a float input or output (or weight) of theirs
    exceeds `DATA_MAX` in magnitude in one fp32 reference run on generated inputs at
    `input_shapes` (AutoCast's IORangeRule, with a threshold nearer fp16's range than its 512): a
    PP-OCR detector's folded BatchNorm computes a 9.8e7 variance, inf in fp16, and its fp16 output
    came out unrelated to fp32's (cosine 0.02). Returns (nodes, a note when the check could not run)."""
    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        return [], "fp16: range check skipped (the model is past the 2 GB protobuf limit)"
    import numpy as np
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    from enginecache.core.calibration import random_batches, read_model_inputs

    ort_errors = (
        ort_state.Fail,
        ort_state.InvalidArgument,
        ort_state.InvalidGraph,
        ort_state.NotImplemented,
        ort_state.RuntimeException,
        ort_state.EPFail,
    )

    probe = ModelProto()
    probe.CopyFrom(model)
    declared = {value.name for value in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in declared:
                probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
                declared.add(name)
    try:
        feed = random_batches(read_model_inputs(source), input_shapes, batches=1, model=source)[0]
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        names = [out.name for out in session.get_outputs()]
        values = session.run(names, feed)
    except (*ort_errors, EngineCacheError, MemoryError, ValueError, RuntimeError) as err:  # best effort
        return [], f"fp16: range check skipped (the fp32 reference run failed: {trim(str(err), 200)})"
    peaks: dict[str, float] = {}
    for name, value in zip(names, values, strict=True):
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.size:
            peaks[name] = float(np.nanmax(np.abs(array)))
    for init in model.graph.initializer:
        if init.data_type == TensorProto.FLOAT and init.data_location != TensorProto.EXTERNAL:
            array = onnx.numpy_helper.to_array(init)
            if array.size:
                peaks[init.name] = float(np.nanmax(np.abs(array)))
    blocks = [
        node.name
        for node in model.graph.node
        if any(peaks.get(name, 0.0) > DATA_MAX for name in [*node.input, *node.output])
    ]
    return blocks, ""


def _convert(model: ModelProto, blocked: set[str], source: Path) -> tuple[ModelProto, int]:
    from onnxconverter_common import float16

    work = ModelProto()
    work.CopyFrom(model)
    split_shared_initializers(work, set(OP_BLOCK_LIST), blocked)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # the converter raises plain ValueError/AssertionError/onnx errors
        with converter_failure(f"{CONVERTER} failed to convert {source.name} to fp16"):
            converted = float16.convert_float_to_float16(
                work,
                min_positive_val=MIN_POSITIVE,
                max_finite_val=MAX_FINITE,
                keep_io_types=True,
                op_block_list=list(OP_BLOCK_LIST),
                node_block_list=sorted(blocked),
            )
    clamped = sum(1 for w in caught if "will be truncated to" in str(w.message))
    return converted, clamped


def type_errors(model: ModelProto) -> dict[str, str]:
    """Node name -> op type for the nodes ONNX's strict type inference rejects (nested ones too),
    else for the node an ONNX Runtime CPU session refuses (a type its schema or kernels do not take:
    Celu is float32 only). Models past the protobuf limit skip the session check (validation runs it)."""
    try:
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
        return {name.strip(): op.strip() for op, name in _NODE_ERROR.findall(str(err))}
    if model.ByteSize() > EXTERNAL_DATA_THRESHOLD:
        return {}
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except (ort_state.Fail, ort_state.InvalidGraph, ort_state.NotImplemented) as err:
        ops = {node.name: node.op_type for node in nested_nodes(model) if node.name}
        found = (next(g for g in match.groups() if g) for match in _ORT_NODE.finditer(str(err)))
        named = [name for name in found if name in ops]
        return {name: ops[name] for name in named}
    return {}


def _top_level_ancestors(model: ModelProto) -> dict[str, str]:
    """Node name -> the name of the main-graph node it is (or sits inside)."""
    ancestors: dict[str, str] = {}
    for top in model.graph.node:
        ancestors[top.name] = top.name
        for graph in walk(list(subgraphs(top))):
            for node in graph.node:
                ancestors[node.name] = top.name
    return ancestors
