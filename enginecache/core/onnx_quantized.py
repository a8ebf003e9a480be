"""Whether and how an ONNX model is already quantized, read from its proto without loading weights,
and whether TensorRT can read that quantization (`tensorrt_unreadable`).

A quantized model builds only as is (fp32): `core.precision` refuses to convert it, and
`core.onnx_info` reports how it is quantized. Only some quantized models build as is with TensorRT:
its parser takes Q/DQ nodes of signed symmetric types (what ModelOpt writes), not ONNX Runtime's
QOperator or integer ops, int32 or asymmetric Q/DQ, or weights dequantized by Cast/Mul.
"""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import ModelProto, TensorProto, numpy_helper

from enginecache.core.onnx_graph import all_graphs, all_nodes, op_key, tensor_size

_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_INTEGER_OPS = (
    "ConvInteger",
    "MatMulInteger",
    "DynamicQuantizeLinear",
    "com.microsoft:DynamicQuantizeMatMul",
    "com.microsoft:MatMulInteger16",
    "com.microsoft:MatMulNBits",
    "com.microsoft:QAttention",
    "com.microsoft:QGemm",
    "com.microsoft:QOrderedMatMul",
    "com.microsoft:DynamicQuantizeLSTM",
    "com.microsoft:GatherBlockQuantized",
)
_LOW_BIT_WEIGHTS = frozenset({TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.UINT4})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
_FLOAT8_TYPES = frozenset(
    {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
)
MIN_QUANTIZED_WEIGHT = 256
"""Elements an INT8/UINT8 tensor needs to count as a quantized weight (smaller ones are masks or lookups)."""


def quantization(model: ModelProto) -> str | None:
    """How a model is already quantized, in words, or None for a float model.

    Recognised: Q/DQ nodes (`QuantizeLinear`/`DequantizeLinear`, any domain), QOperator ops
    (`QLinear*`), integer ops (`ConvInteger`, `MatMulInteger`, `DynamicQuantizeLinear` and
    ONNX Runtime's contrib quantized ops), and weight-only int8: INT8/UINT8/INT4/UINT4 weights of
    `MIN_QUANTIZED_WEIGHT` elements or more (initializers or Constant nodes) that a `Cast` to a
    float type or a `Mul` consumes. Subgraphs and model-local functions are searched too.
    """
    ops: dict[str, int] = {}
    for node in all_nodes(model):
        key = op_key(node)
        ops[key] = ops.get(key, 0) + 1
    found: list[str] = []
    qdq = {op: n for op, n in ops.items() if op.rsplit(":", 1)[-1] in _QDQ_OPS}
    if qdq:
        found.append("Q/DQ nodes (" + ", ".join(f"{n} {op}" for op, n in sorted(qdq.items())) + ")")
    qlinear = {op: n for op, n in ops.items() if op.rsplit(":", 1)[-1].startswith("QLinear")}
    if qlinear:
        found.append("QOperator ops (" + ", ".join(f"{n} {op}" for op, n in sorted(qlinear.items())) + ")")
    integer = {op: ops[op] for op in _INTEGER_OPS if op in ops}
    if integer:
        found.append("integer ops (" + ", ".join(f"{n} {op}" for op, n in sorted(integer.items())) + ")")
    weights = _dequantized_weights(model)
    if weights:
        plural = "s" if weights != 1 else ""
        found.append(f"{weights} INT8/UINT8 weight tensor{plural} dequantized by Cast/Mul (weight-only quantization)")
    return "; ".join(found) or None


def quantized_arithmetic(model: ModelProto) -> str | None:
    """The precision whose arithmetic a quantized model runs ("fp8" where any of its tensors or Q/DQ
    outputs are float8, else "int8"), or None for a float model (`quantization` finds nothing)."""
    if quantization(model) is None:
        return None
    for graph in all_graphs(model):
        if any(t.data_type in _FLOAT8_TYPES for t in graph.initializer):
            return "fp8"
    for node in all_nodes(model):
        for attr in node.attribute:
            if attr.name in ("output_dtype", "to") and attr.i in _FLOAT8_TYPES:
                return "fp8"
            if attr.name == "value" and attr.t.data_type in _FLOAT8_TYPES:
                return "fp8"
    return "int8"


def _dequantized_weights(model: ModelProto) -> int:
    """INT8/UINT8/INT4/UINT4 weights consumed by a Cast to float or a Mul, per graph."""
    total = 0
    for graph in all_graphs(model):
        low_bit = {
            t.name
            for t in graph.initializer
            if t.data_type in _LOW_BIT_WEIGHTS and tensor_size(t)[0] >= MIN_QUANTIZED_WEIGHT
        }
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if (
                        attr.name == "value"
                        and attr.t.data_type in _LOW_BIT_WEIGHTS
                        and tensor_size(attr.t)[0] >= MIN_QUANTIZED_WEIGHT
                    ):
                        low_bit.add(node.output[0])
        if not low_bit:
            continue
        used: set[str] = set()
        for node in graph.node:
            if node.op_type == "Cast":
                to = next((a.i for a in node.attribute if a.name == "to"), None)
                if to in _FLOAT_TYPES and node.input and node.input[0] in low_bit:
                    used.add(node.input[0])
            elif node.op_type == "Mul":
                used.update(name for name in node.input if name in low_bit)
        total += len(used)
    return total


# What TensorRT's ONNX parser takes as a Q/DQ node's quantized type (its zero point's type, or the
# integer input a DequantizeLinear reads): "input has type Int32 but must have type FP8, FP4, Int4,
# Int8, or UInt8" (TensorRT-RTX 1.x); and every zero point 0 ("Non-zero zero point is not supported").
TENSORRT_READS = "TensorRT reads quantization only as Q/DQ nodes of INT8, FP8 or INT4 with zero points 0"
_TENSORRT_QDQ_TYPES = frozenset(
    {TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4, TensorProto.FLOAT4E2M1, *_FLOAT8_TYPES}
)


def tensorrt_unreadable(model: ModelProto) -> str | None:
    """Why TensorRT (and TensorRT-RTX) cannot build this already-quantized model as is, in words, or
    None where its quantization is Q/DQ TensorRT reads (or the model is not quantized).

    Refused: QOperator ops (`QLinear*`), integer ops (ConvInteger, MatMulInteger,
    DynamicQuantizeLinear, ONNX Runtime's contrib quantized ops), int8 weights dequantized by
    Cast/Mul, and Q/DQ nodes whose quantized type is not one TensorRT takes (int32 biases, 16-bit)
    or whose zero point is not 0 (asymmetric). Read from the proto: zero points stored outside it
    (external data) are judged by their type only."""
    how = quantization(model)
    if how is None:
        return None
    reasons = [part for part in how.split("; ") if not part.startswith("Q/DQ nodes")]
    reasons += _unreadable_qdq(model)
    if not reasons:
        return None
    return "; ".join(reasons) + f" ({TENSORRT_READS})"


def tensorrt_unreadable_file(path: Path) -> str | None:
    """`tensorrt_unreadable` of the model at `path`, read without its external data."""
    return tensorrt_unreadable(onnx.load(str(path), load_external_data=False))


def _unreadable_qdq(model: ModelProto) -> list[str]:
    """The Q/DQ nodes TensorRT refuses, counted by why."""
    wrong_type: dict[str, int] = {}
    asymmetric = 0
    for graph in all_graphs(model):
        constants = {t.name: t for t in graph.initializer}
        for node in graph.node:
            if node.op_type == "Constant" and node.output:
                for attr in node.attribute:
                    if attr.name == "value":
                        constants[node.output[0]] = attr.t
        for node in graph.node:
            if node.op_type not in _QDQ_OPS:
                continue
            zero = constants.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
            read = constants.get(node.input[0]) if node.op_type == "DequantizeLinear" and node.input else None
            quantized = zero if zero is not None else read
            if quantized is not None and quantized.data_type not in _TENSORRT_QDQ_TYPES:
                name = TensorProto.DataType.Name(quantized.data_type)
                wrong_type[name] = wrong_type.get(name, 0) + 1
            elif zero is not None and _nonzero(zero):
                asymmetric += 1
    found = [f"{n} Q/DQ node{'s' if n != 1 else ''} of {name}" for name, n in sorted(wrong_type.items())]
    if asymmetric:
        found.append(f"{asymmetric} Q/DQ node{'s' if asymmetric != 1 else ''} with a non-zero zero point (asymmetric)")
    return found


def _nonzero(tensor: TensorProto) -> bool:
    """Whether a zero point stored in the proto holds any value but 0 (one stored outside it: unknown, False)."""
    if tensor.data_location == TensorProto.EXTERNAL:
        return False
    return bool(numpy_helper.to_array(tensor).astype("float64").any())
