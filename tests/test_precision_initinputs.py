"""A model that also lists its initializers among its graph inputs (IR 4, as PyTorch before 1.4
exported: a face detector's weights were all inputs too): inspection says so and counts only the
real input, and fp16 with either converter takes them out of the inputs first, so the conversion
that failed with a type-inference error (onnxconverter-common) or a list of input names (AutoCast)
gives a valid fp16 model close to the fp32 one, which TensorRT-RTX parses and builds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginecache.core.onnx_info import inspect_model
from enginecache.core.precision import PrecisionSpec, convert_precision
from tests.precisionkit import cosine, need_modelopt, run_ort, trt_build

WEIGHTS = 8  # the initializers make_weights_as_inputs writes, every one also a graph input
PROFILE = {"input": ((1, 3, 32, 32), (1, 3, 32, 32), (1, 3, 32, 32))}


def make_weights_as_inputs(path: Path, *, ir_version: int = 4) -> Path:
    """A conv net `input[1, 3, 32, 32] -> output[1, 10]` (opset 9, producer pytorch 1.2) whose
    eight weights are also declared as graph inputs, as PyTorch 1.2 exported them."""
    rng = np.random.default_rng(0)
    weights, nodes, previous, channels = [], [], "input", 3
    for i in range(3):
        w = (rng.standard_normal((8, channels, 3, 3)) * 0.3).astype(np.float32)
        weights += [numpy_helper.from_array(w, f"features.{i}.weight")]
        weights += [numpy_helper.from_array((rng.standard_normal(8) * 0.1).astype(np.float32), f"features.{i}.bias")]
        inputs = [previous, f"features.{i}.weight", f"features.{i}.bias"]
        nodes += [helper.make_node("Conv", inputs, [f"conv{i}"], pads=[1, 1, 1, 1])]
        nodes += [helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"])]
        previous, channels = f"relu{i}", 8
    weights += [numpy_helper.from_array((rng.standard_normal((10, 8)) * 0.3).astype(np.float32), "fc.weight")]
    weights += [numpy_helper.from_array(np.zeros(10, np.float32), "fc.bias")]
    nodes += [
        helper.make_node("GlobalAveragePool", [previous], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("Gemm", ["flat", "fc.weight", "fc.bias"], ["output"], transB=1),
    ]
    graph_inputs = [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, 32, 32])]
    graph_inputs += [helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.dims)) for t in weights]
    output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 10])
    graph = helper.make_graph(nodes, "torch-jit-export", graph_inputs, [output], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.producer_name, model.producer_version, model.ir_version = "pytorch", "1.2", ir_version
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def test_inspection_counts_the_weights_listed_as_inputs_and_only_the_real_input(tmp_path: Path) -> None:
    info = inspect_model(make_weights_as_inputs(tmp_path / "face.onnx"))
    assert [t.name for t in info.inputs] == ["input"]
    assert info.initializer_inputs == WEIGHTS and info.to_dict()["initializer_inputs"] == WEIGHTS
    assert inspect_model(make_weights_as_inputs(tmp_path / "ir3.onnx", ir_version=3)).initializer_inputs == WEIGHTS


@pytest.mark.parametrize(("converter", "ir_version"), [("onnxconverter", 4), ("onnxconverter", 3), ("modelopt", 4)])
def test_fp16_of_weights_listed_as_inputs_converts_close_to_fp32(
    tmp_path: Path, converter: str, ir_version: int
) -> None:
    if converter == "modelopt":
        need_modelopt()
    source = make_weights_as_inputs(tmp_path / "face.onnx", ir_version=ir_version)
    result = convert_precision(source, PrecisionSpec("fp16", converter=converter), tmp_path / "work")

    [note] = [w for w in result.warnings if "also listed as graph inputs" in w]
    assert f"{WEIGHTS} initializer(s) also listed as graph inputs at IR {ir_version}" in note
    converted = onnx.load(str(result.path))
    assert [v.name for v in converted.graph.input] == ["input"] and converted.ir_version >= 4
    assert any(t.data_type == TensorProto.FLOAT16 for t in converted.graph.initializer)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [result.path.name]  # the staged copy is gone

    feeds = {"input": np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    [fp32], [fp16] = run_ort(source, feeds), run_ort(result.path, feeds)
    assert cosine(fp32, fp16) >= 0.999
    assert trt_build(result.path, PROFILE) > 0
