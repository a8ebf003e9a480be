"""Whether a model already computes in a precision: every float tensor the graph declares (its
initializers, inputs, outputs, Constant values and Cast targets) is of that type, so converting it
to that precision would change nothing. Reads the graph only (never its external weights)."""

from __future__ import annotations

from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from enginecache.errors import PrecisionError

_FLOATS = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)
_BY_PRECISION = {"fp16": onnx.TensorProto.FLOAT16, "bf16": onnx.TensorProto.BFLOAT16}


def _declared_types(graph: onnx.GraphProto) -> list[int]:
    types = [t.data_type for t in graph.initializer]
    types += [v.type.tensor_type.elem_type for v in (*graph.input, *graph.output) if v.type.HasField("tensor_type")]
    for node in graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to":
                types.append(attr.i)
            elif attr.type == onnx.AttributeProto.TENSOR:
                types.append(attr.t.data_type)
            elif attr.type == onnx.AttributeProto.GRAPH:
                types += _declared_types(attr.g)
    return types


def computes_in(path: Path, precision: str) -> bool:
    """True when `precision` (fp16 or bf16) is the only float type `path`'s graph declares and it
    declares at least one; False for any other precision or a graph with other float types."""
    wanted = _BY_PRECISION.get(precision)
    if wanted is None:
        return False
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, ValueError, DecodeError) as err:
        raise PrecisionError(f"cannot load {path}: {err}") from err
    floats = {t for t in _declared_types(model.graph) if t in _FLOATS}
    return floats == {wanted}
