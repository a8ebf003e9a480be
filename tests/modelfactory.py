"""Small real ONNX models made with onnx.helper, for the core suite (no ../shared needed)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def file_sha256(path: Path) -> str:
    """A file's sha256, computed here independently of core.hashing."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_unchecked(model: onnx.ModelProto, path: Path) -> Path:
    """Write a model as it is, without onnx.checker (for models that are meant to be odd or bad)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


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
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [batch_dim, features])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [batch_dim, hidden])],
        initializer=[w1, b1, w2],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="enginecache-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def make_conv(path: Path, *, seed: int = 0) -> Path:
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
    graph = helper.make_graph(
        nodes,
        "convnet",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])],
        initializer=[conv_w, conv_b, fc_w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="enginecache-tests")
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


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
