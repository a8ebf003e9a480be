"""core.onnx_info: inspection without weights and the digest, on factory models and the shapes
real-world models come in (external data, bad input and the shared models have files of their own)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginecache.core.onnx_info import ModelInfo, TensorInfo, inspect_model
from enginecache.errors import InvalidModelError
from tests.modelfactory import file_sha256 as sha256
from tests.modelfactory import make_conv, make_mlp, save_unchecked


def _model(graph: onnx.GraphProto, *, opset: int, ir_version: int) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = ir_version
    return model


def _save_checked(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


# --- factory models --------------------------------------------------------------------


def test_mlp_io_opset_producer_histogram_parameters(tmp_path: Path) -> None:
    path = make_mlp(tmp_path / "mlp.onnx", features=16, hidden=32)
    info = inspect_model(path)

    assert info.path == path
    assert info.inputs == (TensorInfo("input", "float32", ("batch", 16)),)
    assert info.outputs == (TensorInfo("output", "float32", ("batch", 32)),)
    assert info.inputs[0].is_dynamic
    assert info.ir_version == 8
    assert info.opsets == {"": 17}
    assert info.producer_name == "enginecache-tests"
    assert info.producer_version == ""
    assert info.graph_name == "mlp"
    assert info.op_histogram == {"MatMul": 2, "Add": 1, "Relu": 1}
    # w1 16x32 + b1 32 + w2 32x32, float32
    assert info.parameter_count == 16 * 32 + 32 + 32 * 32
    assert info.parameter_bytes == 4 * (16 * 32 + 32 + 32 * 32)
    assert info.external_data_files == ()
    assert info.size_bytes == path.stat().st_size
    assert info.digest == sha256(path)


def test_fixed_batch_is_not_dynamic_and_opset_is_read(tmp_path: Path) -> None:
    info = inspect_model(make_mlp(tmp_path / "mlp.onnx", batch_dim=4, opset=13))
    assert info.inputs[0].shape == (4, 16)
    assert not info.inputs[0].is_dynamic
    assert not info.outputs[0].is_dynamic
    assert info.opsets == {"": 13}


def test_conv_parameters_and_histogram(tmp_path: Path) -> None:
    info = inspect_model(make_conv(tmp_path / "conv.onnx"))
    assert info.inputs[0].shape == ("batch", 3, 32, 32)
    assert info.outputs[0].shape == ("batch", 10)
    assert info.parameter_count == 8 * 3 * 3 * 3 + 8 + 8 * 10
    assert info.parameter_bytes == 4 * info.parameter_count
    assert info.op_histogram == {
        "Conv": 1,
        "Relu": 1,
        "GlobalAveragePool": 1,
        "Flatten": 1,
        "MatMul": 1,
    }


def test_to_dict_is_json_safe(tmp_path: Path) -> None:
    info = inspect_model(make_mlp(tmp_path / "mlp.onnx"))
    data = json.loads(json.dumps(info.to_dict()))
    assert data["path"] == str(info.path)
    assert data["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 16], "dynamic": True}]
    assert data["digest"] == info.digest
    assert data["op_histogram"] == {"MatMul": 2, "Add": 1, "Relu": 1}
    assert set(data) == {f for f in ModelInfo.__dataclass_fields__}


def test_different_weights_give_different_digests(tmp_path: Path) -> None:
    a = inspect_model(make_mlp(tmp_path / "a.onnx", seed=0))
    b = inspect_model(make_mlp(tmp_path / "b.onnx", seed=1))
    assert a.digest != b.digest
    assert a.parameter_count == b.parameter_count


# --- shapes of real-world models --------------------------------------------------------


def test_ir3_opset9_initializers_listed_as_inputs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"])],
        "old",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[w, b],
    )
    model = _model(graph, opset=9, ir_version=3)
    path = _save_checked(model, tmp_path / "old.onnx")

    info = inspect_model(path)
    assert [t.name for t in info.inputs] == ["x"]
    assert info.ir_version == 3
    assert info.opsets == {"": 9}
    assert info.parameter_count == 4 * 3 + 3


def test_if_subgraph_ops_reported_apart(tmp_path: Path) -> None:
    then_graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["t0"]),
            helper.make_node("Neg", ["t0"], ["then_out"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["else_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
        ],
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    model = _model(graph, opset=17, ir_version=8)
    path = _save_checked(model, tmp_path / "if.onnx")

    info = inspect_model(path)
    assert info.op_histogram == {"Greater": 1, "If": 1, "ReduceSum": 1}  # the main graph only
    assert info.subgraph_op_histogram == {"Abs": 1, "Neg": 1, "Relu": 1}  # both branches of the If
    assert info.to_dict()["subgraph_op_histogram"] == info.subgraph_op_histogram
    assert info.parameter_count == 1  # a scalar initializer counts one element
    assert info.parameter_bytes == 4


def test_custom_domain_ops_are_prefixed(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("MyOp", ["r"], ["y"], domain="com.example"),
        ],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("com.example", 1),
        ],
    )
    model.ir_version = 8
    path = save_unchecked(model, tmp_path / "custom.onnx")
    info = inspect_model(path)
    assert info.op_histogram == {"Relu": 1, "com.example:MyOp": 1}
    assert info.opsets == {"": 17, "com.example": 1}


def test_unknown_and_symbolic_dims(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["y"]),
            helper.make_node("Shape", ["x"], ["s"]),
        ],
        "dims",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [-1, None, "unk__214", "floor(h/2)", 7])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", -1, None, 3, 7]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [5]),
        ],
    )
    model = _model(graph, opset=17, ir_version=8)
    path = save_unchecked(model, tmp_path / "dims.onnx")
    info = inspect_model(path)

    x = info.inputs[0]
    assert x.dtype == "float16"
    assert x.shape == ("?", "?", "unk__214", "floor(h/2)", 7)
    assert x.is_dynamic
    y, s = info.outputs
    assert y.shape == ("batch", "?", "?", 3, 7)
    assert y.to_dict()["shape"] == ["batch", "?", "?", 3, 7]
    assert s == TensorInfo("s", "int64", (5,))
    assert not s.is_dynamic


def test_main_graph_output_without_shape_is_rejected(tmp_path: Path) -> None:
    """onnx.checker requires main-graph tensor IO to declare a shape (rank); unknown rank fails."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "norank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = _model(graph, opset=17, ir_version=8)
    path = save_unchecked(model, tmp_path / "norank.onnx")
    with pytest.raises(InvalidModelError, match=r"onnx\.checker.*'shape'"):
        inspect_model(path)


@pytest.mark.parametrize(
    ("elem_type", "name"),
    [
        (TensorProto.INT32, "int32"),
        (TensorProto.BOOL, "bool"),
        (TensorProto.BFLOAT16, "bfloat16"),
        (TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"),
        (TensorProto.STRING, "string"),
    ],
)
def test_dtype_names(tmp_path: Path, elem_type: int, name: str) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "dtype",
        [helper.make_tensor_value_info("x", elem_type, [3])],
        [helper.make_tensor_value_info("y", elem_type, [3])],
    )
    model = _model(graph, opset=21, ir_version=10)
    info = inspect_model(save_unchecked(model, tmp_path / "dtype.onnx"))
    assert info.inputs[0].dtype == name


def test_sub_byte_parameter_bytes(tmp_path: Path) -> None:
    w = helper.make_tensor("w", TensorProto.INT4, [5], [1, 2, 3, -1, -2])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "int4",
        [],
        [helper.make_tensor_value_info("y", TensorProto.INT4, [5])],
        initializer=[w],
    )
    model = _model(graph, opset=21, ir_version=10)
    info = inspect_model(save_unchecked(model, tmp_path / "int4.onnx"))
    assert info.parameter_count == 5
    assert info.parameter_bytes == 3  # five 4-bit values pack into three bytes


def test_constant_node_weights_are_parameters(tmp_path: Path) -> None:
    from tests.modelfactory import make_constant_weights

    info = inspect_model(make_constant_weights(tmp_path / "constants.onnx", features=16, hidden=32))
    # w1 [16, 32], b1 [32] and the value_float scalar; the INT64 shape Constant is not a weight
    assert info.parameter_count == 16 * 32 + 32 + 1
    assert info.parameter_bytes == 4 * info.parameter_count
    assert info.op_histogram["Constant"] == 4
    assert info.subgraph_op_histogram == {}
    assert info.quantized is None
