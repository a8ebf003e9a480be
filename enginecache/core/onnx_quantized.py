"""Whether and how an ONNX model is already quantized, read from its proto without loading weights.

A quantized model builds only as is (fp32): `core.precision` refuses to convert it, and
`core.onnx_info` reports how it is quantized.
"""

from __future__ import annotations

from onnx import ModelProto, TensorProto

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
