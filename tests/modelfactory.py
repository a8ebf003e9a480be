"""Small real ONNX models made with onnx.helper, for the core suite (no ../shared needed)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PRODUCER = "enginecache-tests"  # the producer_name of make_mlp's and make_conv's models


def file_sha256(path: Path) -> str:
    """A file's sha256, computed here independently of core.hashing."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_unchecked(model: onnx.ModelProto, path: Path) -> Path:
    """Write a model as it is, without onnx.checker (for models that are meant to be odd or bad)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


def _save_checked(model: onnx.ModelProto, path: Path) -> Path:
    """Write a model at IR version 8 once onnx.checker (with shape inference) passes it."""
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def _save_float_graph(
    path: Path,
    name: str,
    nodes: list[onnx.NodeProto],
    input_dims: Sequence[str | int | None],
    output_dims: Sequence[str | int | None],
    initializer: Sequence[onnx.TensorProto] = (),
    opset: int = 17,
    producer_name: str | None = None,
) -> Path:
    """Write the graph `nodes` from one float32 `input[input_dims]` to one float32
    `output[output_dims]` as a model of `opset` (by `producer_name` where given), checked."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, input_dims)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, output_dims)],
        initializer=list(initializer),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    if producer_name is not None:
        model.producer_name = producer_name
    return _save_checked(model, path)


def make_mlp(
    path: Path,
    *,
    batch_dim: str | int = "batch",
    features: int = 16,
    hidden: int = 32,
    seed: int = 0,
    opset: int = 17,
) -> Path:
    """Write a two-layer MLP `input[batch, features] -> output[batch, hidden]` and return its path."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array(rng.standard_normal((features, hidden)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal((hidden,)).astype(np.float32), "b1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, hidden)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Relu", ["h1"], ["h2"], name="relu"),
        helper.make_node("MatMul", ["h2", "w2"], ["output"], name="fc2"),
    ]
    return _save_float_graph(
        path, "mlp", nodes, [batch_dim, features], [batch_dim, hidden], [w1, b1, w2], opset, PRODUCER
    )


def make_conv(path: Path, *, seed: int = 0, opset: int = 17) -> Path:
    """Write a small conv net `input[batch, 3, 32, 32] -> output[batch, 10]`."""
    rng = np.random.default_rng(seed)
    conv_w = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.1, "conv_w")
    conv_b = numpy_helper.from_array(np.zeros(8, np.float32), "conv_b")
    fc_w = numpy_helper.from_array(rng.standard_normal((8, 10)).astype(np.float32) * 0.1, "fc_w")
    nodes = [
        helper.make_node("Conv", ["input", "conv_w", "conv_b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "fc_w"], ["output"], name="fc"),
    ]
    return _save_float_graph(
        path, "convnet", nodes, ["batch", 3, 32, 32], ["batch", 10], [conv_w, conv_b, fc_w], opset, PRODUCER
    )


def make_external_data_model(folder: Path, *, name: str = "ext.onnx", seed: int = 0) -> Path:
    """Write an MLP whose weights live in an external data file beside it; return the model path."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = make_mlp(folder / "tmp_inline.onnx", seed=seed, features=64, hidden=64)
    model = onnx.load(str(tmp))
    tmp.unlink()
    target = folder / name
    onnx.save(
        model,
        str(target),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=name + ".data",
        size_threshold=0,
    )
    return target


# --- precision and inspection models ---------------------------------------------------------------


def make_pad_resize(path: Path, *, seed: int = 0) -> Path:
    """`input[batch, 3, h, w] -> output[batch, 4, 2h+4, 2w+4]`: a reflect Pad, a Conv, a Resize (its
    scales a float32 initializer), and a `Cast(to=FLOAT)` of a Shape feeding a Div, the pattern
    onnxconverter-common leaves typed float16 while the Cast still says float (fully dynamic H, W)."""
    rng = np.random.default_rng(seed)
    weight = numpy_helper.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.1).astype(np.float32), "conv_w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    pads = numpy_helper.from_array(np.array([0, 0, 3, 3, 0, 0, 3, 3], np.int64), "pads")
    nodes = [
        helper.make_node("Pad", ["input", "pads"], ["p"], name="reflect_pad", mode="reflect"),
        helper.make_node("Conv", ["p", "conv_w"], ["c"], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Resize", ["r", "", "scales"], ["up"], name="resize", mode="linear"),
        helper.make_node("Shape", ["up"], ["shape"], name="shape", start=2),
        helper.make_node("Cast", ["shape"], ["shape_f"], name="shape_to_float", to=TensorProto.FLOAT),
        helper.make_node("ReduceMax", ["shape_f"], ["side"], name="side", keepdims=1),
        helper.make_node("Div", ["up", "side"], ["output"], name="normalise"),
    ]
    return _save_float_graph(
        path, "pad_resize", nodes, ["batch", 3, "h", "w"], ["batch", 4, None, None], [weight, scales, pads]
    )


def make_celu(path: Path) -> Path:
    """`input[batch, 8] -> output[batch, 8]` through MatMul, Celu and Add, unnamed nodes: ONNX's Celu
    takes float32 only, so a plain fp16 conversion of it fails type inference."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32) * 0.3, "w")
    bias = numpy_helper.from_array(np.full(8, 0.5, np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["input", "w"], ["m"]),
        helper.make_node("Celu", ["m"], ["c"], alpha=1.0),
        helper.make_node("Add", ["c", "b"], ["output"]),
    ]
    return _save_float_graph(path, "celu", nodes, ["batch", 8], ["batch", 8], [weight, bias])


def make_if_outer_input(path: Path) -> Path:
    """`x[4], flag[] -> y[4]`: an If whose branches read the float graph input `x` (from the outer
    scope) and a weight; the main graph uses `x` nowhere else (silero-VAD's layout)."""
    weight = numpy_helper.from_array(np.linspace(0.5, 2.0, 4).astype(np.float32), "scale")
    then_graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "scale"], ["then_out"], name="then_mul")],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [4])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "scale"], ["else_out"], name="else_sub")],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [4])],
    )
    graph = helper.make_graph(
        [helper.make_node("If", ["flag"], ["y"], name="branch", then_branch=then_graph, else_branch=else_graph)],
        "if_outer",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[weight],
    )
    return _save_checked(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def make_constant_weights(path: Path, *, features: int = 16, hidden: int = 32, opset: int = 17) -> Path:
    """The MLP of `make_mlp` with its weights in Constant nodes (tf2onnx and PaddlePaddle exports do
    this), plus an INT64 shape Constant that is not a weight; no initializers."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((features, hidden)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array(rng.standard_normal((hidden,)).astype(np.float32), "b1")
    shape = numpy_helper.from_array(np.array([-1, hidden], np.int64), "shape")
    nodes = [
        helper.make_node("Constant", [], ["w1"], name="w1_const", value=w1),
        helper.make_node("Constant", [], ["b1"], name="b1_const", value=b1),
        helper.make_node("Constant", [], ["alpha"], name="alpha_const", value_float=0.5),
        helper.make_node("Constant", [], ["shape"], name="shape_const", value=shape),
        helper.make_node("MatMul", ["input", "w1"], ["h0"], name="fc1"),
        helper.make_node("Add", ["h0", "b1"], ["h1"], name="fc1_bias"),
        helper.make_node("Mul", ["h1", "alpha"], ["h2"], name="scale"),
        helper.make_node("Reshape", ["h2", "shape"], ["output"], name="reshape"),
    ]
    return _save_float_graph(path, "constant_weights", nodes, ["batch", features], ["batch", hidden], opset=opset)


def make_int8_cast_mul(path: Path, *, features: int = 32, hidden: int = 16) -> Path:
    """Weight-only int8 the way some exporters write it: an INT8 initializer, `Cast(to=FLOAT)`, a
    `Mul` by its float scale, then the MatMul (no Q/DQ nodes)."""
    rng = np.random.default_rng(0)
    q = numpy_helper.from_array(rng.integers(-127, 128, (features, hidden)).astype(np.int8), "w_int8")
    scale = numpy_helper.from_array(np.array(0.01, np.float32), "w_scale")
    nodes = [
        helper.make_node("Cast", ["w_int8"], ["w_float"], name="w_cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["w_float", "w_scale"], ["w"], name="w_dequant"),
        helper.make_node("MatMul", ["input", "w"], ["output"], name="fc"),
    ]
    return _save_float_graph(path, "int8_cast_mul", nodes, ["batch", features], ["batch", hidden], [q, scale])


def quantize_with_ort(
    source: Path, target: Path, *, mode: str = "qdq", symmetric: bool = False, quantize_bias: bool = True
) -> Path:
    """Quantize `source` (one float input `input`, dims past the first static) with
    onnxruntime.quantization: `qdq` (static, QDQ format), `qoperator` (static, QLinear* ops) or
    `dynamic` (MatMulInteger/ConvInteger with DynamicQuantizeLinear). `symmetric`: static int8
    activations and weights, both symmetric (what TensorRT reads), the bias INT32 unless
    `quantize_bias` is False (then it stays float)."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    if mode == "dynamic":
        quantize_dynamic(str(source), str(target))
        return target
    graph = onnx.load(str(source), load_external_data=False).graph
    dims = [d.dim_value or 1 for d in graph.input[0].type.tensor_type.shape.dim]
    feeds = [{"input": np.random.default_rng(i).standard_normal(dims).astype(np.float32)} for i in range(2)]

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.items = iter(feeds)

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)

    quant_format = QuantFormat.QDQ if mode == "qdq" else QuantFormat.QOperator
    int8: dict[str, Any] = {}
    if symmetric:
        options = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": quantize_bias}
        int8 = {"activation_type": QuantType.QInt8, "weight_type": QuantType.QInt8, "extra_options": options}
    quantize_static(str(source), str(target), Reader(), quant_format=quant_format, **int8)
    return target


def make_range_grid(path: Path) -> Path:
    """`input[batch, 4, h, w] -> output`: a YOLO-head-like grid, `Range(0, float(h), 1)` from the
    input's own shape (int64 -> Cast(to=FLOAT) -> Range, a shape computation) added to a conv."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32), "conv_w")
    consts = [
        numpy_helper.from_array(np.array([2], np.int64), "axis_h"),
        numpy_helper.from_array(np.array(0.0, np.float32), "start"),
        numpy_helper.from_array(np.array(1.0, np.float32), "delta"),
        numpy_helper.from_array(np.array([1, 1, -1, 1], np.int64), "grid_shape"),
    ]
    nodes = [
        helper.make_node("Conv", ["input", "conv_w"], ["c"], name="conv"),
        helper.make_node("Shape", ["c"], ["shape"], name="shape"),
        helper.make_node("Gather", ["shape", "axis_h"], ["h1"], name="gather_h", axis=0),
        helper.make_node("Squeeze", ["h1"], ["h"], name="squeeze_h"),
        helper.make_node("Cast", ["h"], ["h_float"], name="h_to_float", to=TensorProto.FLOAT),
        helper.make_node("Range", ["start", "h_float", "delta"], ["rows"], name="rows"),
        helper.make_node("Reshape", ["rows", "grid_shape"], ["grid"], name="grid"),
        helper.make_node("Add", ["c", "grid"], ["output"], name="add_grid"),
    ]
    return _save_float_graph(
        path, "range_grid", nodes, ["batch", 4, "h", "w"], ["batch", 4, "h", "w"], [weight, *consts]
    )


def make_large_intermediate(path: Path) -> Path:
    """`input[batch, 8] -> output[batch, 8]`: `(input * 1e5) / 1e5` (the first factor a Constant node,
    the second an initializer), an intermediate past fp16's 65504 as in a folded BatchNorm's variance."""
    big = numpy_helper.from_array(np.array(1e5, np.float32), "big")
    nodes = [
        helper.make_node("Constant", [], ["scale"], name="scale_const", value=big),
        helper.make_node("Mul", ["input", "scale"], ["scaled"], name="scale_up"),
        helper.make_node("Div", ["scaled", "divisor"], ["back"], name="scale_down"),
        helper.make_node("Relu", ["back"], ["output"], name="relu"),
    ]
    divisor = numpy_helper.from_array(np.array(1e5, np.float32), "divisor")
    return _save_float_graph(path, "large_intermediate", nodes, ["batch", 8], ["batch", 8], [divisor])


def make_shared_initializer(path: Path) -> Path:
    """`input[batch, 8] -> output[batch, 8]`: `Max(input, c) + (input + c)`, one initializer `c`
    read by Max (kept fp32 by onnxconverter-common's block list) and by Add (converted)."""
    shared = numpy_helper.from_array(np.linspace(-1.0, 1.0, 8).astype(np.float32), "c")
    nodes = [
        helper.make_node("Max", ["input", "c"], ["m"], name="max"),
        helper.make_node("Add", ["input", "c"], ["a"], name="add"),
        helper.make_node("Add", ["m", "a"], ["output"], name="sum"),
    ]
    return _save_float_graph(path, "shared_initializer", nodes, ["batch", 8], ["batch", 8], [shared])
