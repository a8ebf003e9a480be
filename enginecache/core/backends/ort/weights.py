"""The weights an ORT-format engine stores, by element type, read from its flatbuffer.

ONNX Runtime's CPU optimizer (`ORT_ENABLE_ALL`) folds the Casts that an fp16 model (converted with
fp32 inputs and outputs) puts around fp16 weights where this CPU has no fp16 kernel: the optimized
model then holds its weights at fp32, is the size of the fp32 engine and computes in fp32. A
"fp16" ORT engine that ended up so says it (`low_precision_warning`), measured from the initializers
the engine stores.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Element sizes of ONNX's TensorProto data types (the ORT format uses the same numbers).
_FLOAT, _FLOAT16, _BFLOAT16 = 1, 10, 16
_ITEM_BYTES = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 14: 8, 15: 16, 16: 2}
_NAMES = {_FLOAT: "fp32", _FLOAT16: "fp16", _BFLOAT16: "bf16"}
LOW_PRECISION = {"fp16": _FLOAT16, "bf16": _BFLOAT16}


def stored_weight_bytes(engine_path: Path) -> dict[str, int]:
    """Bytes of the float initializers the ORT-format model at `engine_path` stores (its graph and
    its subgraphs), by precision ("fp32", "fp16", "bf16"); from their dims, so an initializer whose
    data the format keeps outside the table counts too."""
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import InferenceSession

    buffer = engine_path.read_bytes()
    session = InferenceSession.InferenceSession.GetRootAsInferenceSession(buffer, 0)
    model = session.Model()
    totals: dict[str, int] = {}
    if model is not None and model.Graph() is not None:
        _add_graph(model.Graph(), totals)
    return totals


def _add_graph(graph: Any, totals: dict[str, int]) -> None:
    for i in range(graph.InitializersLength()):
        _add_tensor(graph.Initializers(i), totals)
    for i in range(graph.SparseInitializersLength()):
        values = graph.SparseInitializers(i).Values()
        if values is not None:
            _add_tensor(values, totals)
    for i in range(graph.NodesLength()):
        node = graph.Nodes(i)
        for j in range(node.AttributesLength()):
            attribute = node.Attributes(j)
            if attribute.G() is not None:
                _add_graph(attribute.G(), totals)
            for k in range(attribute.GraphsLength()):
                _add_graph(attribute.Graphs(k), totals)


def _add_tensor(tensor: Any, totals: dict[str, int]) -> None:
    name = _NAMES.get(tensor.DataType())
    if name is None:
        return
    count = 1
    for j in range(tensor.DimsLength()):
        count *= max(0, int(tensor.Dims(j)))
    totals[name] = totals.get(name, 0) + count * _ITEM_BYTES[tensor.DataType()]


def low_precision_warning(engine_path: Path, precision: str) -> str | None:
    """Where a `precision` (fp16, bf16) ORT engine stores more of its float weights at fp32 than at
    `precision`, the warning that says so, with the bytes measured; else None."""
    if precision not in LOW_PRECISION:
        return None
    stored = stored_weight_bytes(engine_path)
    full, low = stored.get("fp32", 0), stored.get(precision, 0)
    if full <= low:
        return None
    return (
        f"ONNX Runtime stored this {precision} engine's weights at fp32 (measured: {full:,} bytes of fp32 weights, "
        f"{low:,} of {precision}): its CPU optimizer folds the Casts around {precision} weights back to fp32 where "
        f"this CPU has no {precision} kernel, so the engine ({engine_path.stat().st_size:,} bytes) is the size of an "
        f"fp32 one; {precision} weights need another backend (TensorRT)"
    )
