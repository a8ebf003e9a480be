"""Validate a converted model: ONNX checker, strict shape inference, an ONNX Runtime CPU session."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from enginecache.core.onnx_graph import walk
from enginecache.core.precision.modelfiles import trim
from enginecache.errors import EngineCacheError, PrecisionError

logger = logging.getLogger(__name__)


def validate_model(path: Path, *, converter_hint: str = "", converter: str = "") -> tuple[str, ...]:
    """Check a model with the ONNX checker (path-based, so external data and >2 GB models
    work), strict shape inference and an ONNX Runtime CPU session.

    Raises `PrecisionError` naming the converter that made the model (`converter`), the failing
    stage, the node and its op when the message names one, and `converter_hint` (what to install
    or use instead). Returns notes for checks that
    could not run here: an ONNX Runtime CPU build has no kernel for some low-precision ops
    (e.g. bf16 Conv); such a graph has passed ORT's type checks, so it is not an error.
    """
    path = Path(path)
    if not path.is_file():
        raise PrecisionError(f"model {path} does not exist")
    try:
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, OSError, ValueError, DecodeError) as err:
        raise _invalid(path, "ONNX checker", err, converter_hint, converter) from err
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
        raise _invalid(path, "ONNX shape inference", err, converter_hint, converter) from err
    del model

    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except ort_state.NotImplemented as err:
        note = f"onnxruntime CPU cannot run {path.name} (graph types check out): {trim(_strip_ort(str(err)), 300)}"
        logger.info(note)
        return (note,)
    except _ort_errors()[1:] as err:
        raise _invalid(path, "onnxruntime session", err, converter_hint, converter) from err
    del session
    return ()


def run_check(
    source: Path,
    converted: Path,
    input_shapes: Mapping[str, Sequence[int]] | None,
    *,
    converter_hint: str = "",
    converter: str = "",
) -> tuple[str, ...]:
    """Run `converted` once in ONNX Runtime (CPU) on generated inputs at `input_shapes` where
    `source` runs on them: a session that loads can still fail at run time (AutoCast left a stale
    value_info shape in a YOLO head: "Shape mismatch attempting to re-use buffer"). Raises
    `PrecisionError` like `validate_model`; returns a note when the check could not run."""
    import onnxruntime as ort

    from enginecache.core.calibration import random_batches, read_model_inputs

    options = ort.SessionOptions()
    options.log_severity_level = 3
    source_errors: tuple[type[BaseException], ...] = (*_ort_errors(), EngineCacheError, MemoryError)
    try:
        feed = random_batches(read_model_inputs(source), input_shapes, batches=1, model=source)[0]
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"]).run(None, feed)
    except source_errors as err:
        return (f"run check skipped: the source does not run on generated inputs ({trim(_strip_ort(str(err)), 200)})",)
    not_implemented, failures = _ort_errors()[0], _ort_errors()[1:]
    try:
        session = ort.InferenceSession(str(converted), options, providers=["CPUExecutionProvider"])
        session.run(None, feed)
    except not_implemented as err:  # no CPU kernel for a low-precision op: validate_model noted it
        logger.info("run check skipped for %s: %s", converted.name, trim(str(err), 200))
    except failures as err:
        raise _invalid(converted, "onnxruntime run", err, converter_hint, converter) from err
    return ()


def _ort_errors() -> tuple[type[Exception], ...]:
    """ONNX Runtime's error types, NotImplemented first."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return (
        ort_state.NotImplemented,
        ort_state.Fail,
        ort_state.InvalidGraph,
        ort_state.InvalidArgument,
        ort_state.InvalidProtobuf,
        ort_state.RuntimeException,
        ort_state.NoSuchFile,
        ort_state.EPFail,
    )


def _invalid(path: Path, stage: str, err: BaseException, hint: str, converter: str = "") -> PrecisionError:
    message = _strip_ort(str(err))
    found = _node_in_message(message, path)
    where = f" at node '{found[0]}' ({found[1]})" if found else ""
    made = f" (made by {converter})" if converter else ""
    text = f"{path.name}{made} is not a valid model: {stage} failed{where}: {trim(message)}"
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


def _node_in_message(message: str, path: Path) -> tuple[str, str] | None:
    """The graph node a checker/ORT message names and its op, confirmed against the model's nodes
    (subgraphs included)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, ValueError, DecodeError):
        return None
    ops = {node.name: node.op_type for graph in walk([model.graph]) for node in graph.node if node.name}
    for pattern in _NODE_PATTERNS:
        for match in pattern.finditer(message):
            if match.group(1) in ops:
                return match.group(1), ops[match.group(1)]
    found = [name for name in ops if len(name) >= 4 and name in message]
    if not found:
        return None
    name = max(found, key=len)
    return name, ops[name]


def _strip_ort(message: str) -> str:
    """Drop ONNX Runtime's '[ONNXRuntimeError] : 1 : FAIL : Load model from X failed:' prefix,
    keep the first of onnx's per-node inference errors, and name element types."""
    entries = re.findall(r"\(op_type:.*?(?=\(op_type:|$)", message, flags=re.S)
    if len(entries) > 1:
        prefix = message[: message.index("(op_type:")].strip()
        message = f"{prefix} {entries[0].strip()} (and {len(entries) - 1} more node errors)"
    message = re.sub(  # element types only: "differ in dimension 1: (5) vs (32)" stays as it is
        r"(elem type: )\((\d+)\) vs \((\d+)\)",
        lambda m: f"{m.group(1)}({_type_name(int(m.group(2)))}) vs ({_type_name(int(m.group(3)))})",
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
