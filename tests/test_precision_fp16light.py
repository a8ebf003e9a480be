"""fp16 without torch (onnxconverter-common plus our block list and repairs) and the fp16 dispatch:
AutoCast at the build's profile shapes, failures that name the node, the op and the converter, and
hints that never point at the converter that just failed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from enginecache.core.precision import PrecisionSpec, convert_precision, lightfp16, plan_recipe, validate_model
from enginecache.core.precision.check import run_check
from enginecache.errors import PrecisionError
from tests.modelfactory import (
    make_celu,
    make_if_outer_input,
    make_large_intermediate,
    make_pad_resize,
    make_range_grid,
    make_shared_initializer,
)
from tests.precisionkit import cosine, io_types, need_modelopt, run_ort, trt_build

PAD_PROFILE = {"input": ((1, 3, 16, 16), (1, 3, 32, 32), (2, 3, 64, 64))}
LIGHT = PrecisionSpec("fp16", converter="onnxconverter")


def _pixels(shape: tuple[int, ...] = (1, 3, 32, 32)) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(2).standard_normal(shape).astype(np.float32)}


def test_light_fp16_of_reflect_pad_and_resize_validates_and_builds(tmp_path: Path) -> None:
    source = make_pad_resize(tmp_path / "pad_resize.onnx")
    result = convert_precision(source, LIGHT, tmp_path / "work")
    recipe = result.recipe
    assert recipe["tool"] == "onnxconverter_common.float16"
    options = recipe["options"]
    assert isinstance(options, dict) and "Resize" in options["op_block_list"] and options["rules"] == 2
    model = onnx.load(str(result.path))
    nodes = {node.name: node for node in model.graph.node}
    cast = nodes["shape_to_float"]
    assert cast.attribute[0].i == TensorProto.FLOAT16, "the source's Cast(to=FLOAT) now casts to fp16"
    assert {init.name: init.data_type for init in model.graph.initializer}["scales"] == TensorProto.FLOAT
    assert io_types(result.path) == [TensorProto.FLOAT, TensorProto.FLOAT]
    for shape in ((1, 3, 32, 32), (2, 3, 20, 28)):
        (ref,), (got,) = run_ort(source, _pixels(shape)), run_ort(result.path, _pixels(shape))
        assert cosine(ref, got) > 0.999
    assert trt_build(result.path, PAD_PROFILE) > 0


def test_light_fp16_reads_outer_scope_inputs_in_fp16(tmp_path: Path) -> None:
    source = make_if_outer_input(tmp_path / "if.onnx")
    result = convert_precision(source, LIGHT, tmp_path / "work")
    model = onnx.load(str(result.path))
    casts = [node for node in model.graph.node if node.op_type == "Cast" and node.input[0] == "x"]
    assert len(casts) == 1 and casts[0].attribute[0].i == TensorProto.FLOAT16
    x = np.array([1.0, -2.0, 3.0, 0.5], np.float32)
    for flag in (True, False):
        feeds = {"x": x, "flag": np.array(flag)}
        (ref,), (got,) = run_ort(source, feeds), run_ort(result.path, feeds)
        np.testing.assert_allclose(got, ref, rtol=1e-3)


def test_light_fp16_keeps_a_float32_only_op_in_fp32(tmp_path: Path) -> None:
    source = make_celu(tmp_path / "celu.onnx")  # unnamed nodes: named before converting
    result = convert_precision(source, LIGHT, tmp_path / "work")
    options = result.recipe["options"]
    assert isinstance(options, dict) and options["node_block_list"] == ["Celu_ec1"]
    assert any("1 nodes kept in fp32 after type errors: Celu_ec1" in w for w in result.warnings)
    feeds = {"input": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
    (ref,), (got,) = run_ort(source, feeds), run_ort(result.path, feeds)
    assert cosine(ref, got) > 0.999


def test_light_fp16_failure_names_node_op_converter_and_a_true_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_modelopt: None
) -> None:
    monkeypatch.setattr(lightfp16, "MAX_ROUNDS", 1)  # no retry: the Celu stays fp16 and fails validation
    source = make_celu(tmp_path / "celu.onnx")
    with pytest.raises(PrecisionError) as caught:
        convert_precision(source, PrecisionSpec("fp16"), tmp_path / "work")
    message = str(caught.value)
    assert "celu.fp16.onnx (made by onnxconverter-common) is not a valid model" in message
    assert "at node 'Celu_ec1' (Celu)" in message
    assert message.endswith(
        "install the modelopt extra: pip install 'enginecache[modelopt]' "
        "(NVIDIA ModelOpt AutoCast keeps type-sensitive nodes in fp32), or build at fp32"
    )
    assert not list((tmp_path / "work").glob("*.onnx"))


def test_explicit_light_failure_with_modelopt_installed_points_at_autocast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    need_modelopt()
    monkeypatch.setattr(lightfp16, "MAX_ROUNDS", 1)
    with pytest.raises(PrecisionError) as caught:
        convert_precision(make_celu(tmp_path / "celu.onnx"), LIGHT, tmp_path / "work")
    message = str(caught.value)
    assert "onnxconverter-common" in message and "try converter='modelopt'" in message


def test_autocast_runs_at_the_profile_shapes(tmp_path: Path) -> None:
    """Left to itself AutoCast feeds 1x3x1x1 to the fully dynamic input, which a reflect Pad of 3
    cannot take; at the profile's opt shape it converts."""
    need_modelopt()
    source = make_pad_resize(tmp_path / "pad_resize.onnx")
    result = convert_precision(
        source, PrecisionSpec("fp16", converter="modelopt"), tmp_path / "work", input_shapes={"input": (1, 3, 32, 32)}
    )
    options = result.recipe["options"]
    assert result.recipe["tool"] == "modelopt.autocast"
    assert isinstance(options, dict) and options["reference_shapes"] == {"input": [1, 3, 32, 32]}
    assert not list((tmp_path / "work").glob("*autocast-reference*")), "reference inputs cleaned up"
    (ref,), (got,) = run_ort(source, _pixels()), run_ort(result.path, _pixels())
    assert cosine(ref, got) > 0.999
    assert trt_build(result.path, PAD_PROFILE) > 0


def test_fp16_identity_lists_the_converters_tried(no_modelopt: None) -> None:
    identity = plan_recipe(PrecisionSpec("fp16"), input_shapes={"input": (1, 3, 32, 32)})
    assert identity["tool"] == "onnxconverter_common.float16"
    converters = identity["converters"]
    assert isinstance(converters, list) and [c["tool"] for c in converters] == ["onnxconverter_common.float16"]


def test_fp16_identity_with_modelopt_has_the_reference_shapes() -> None:
    need_modelopt()
    identity = plan_recipe(PrecisionSpec("fp16"), input_shapes={"input": (1, 3, 32, 32)})
    converters = identity["converters"]
    assert isinstance(converters, list)
    assert [c["tool"] for c in converters] == ["modelopt.autocast", "onnxconverter_common.float16"]
    assert converters[0]["reference_shapes"] == {"input": [1, 3, 32, 32]}
    other = plan_recipe(PrecisionSpec("fp16"), input_shapes={"input": (1, 3, 64, 64)})
    assert other != identity, "AutoCast's reference shapes are part of the identity"


def test_light_fp16_casts_shape_values_straight_to_float(tmp_path: Path) -> None:
    """int64 -> Cast(to=FLOAT) -> Range (kept fp32) comes out as one Cast to float, not
    int64 -> fp16 -> fp32: TensorRT-RTX refused the half hop in a YOLO head's grid (nudenet 320n)."""
    source = make_range_grid(tmp_path / "grid.onnx")
    result = convert_precision(source, LIGHT, tmp_path / "work")
    model = onnx.load(str(result.path))
    producers = {out: node for node in model.graph.node for out in node.output}
    rows = next(node for node in model.graph.node if node.name == "rows")
    limit = producers[rows.input[1]]
    assert limit.op_type == "Cast" and limit.attribute[0].i == TensorProto.FLOAT
    assert producers[limit.input[0]].name == "squeeze_h", "straight from the int64 shape value"
    feeds = _pixels((2, 4, 12, 9))
    (ref,), (got,) = run_ort(source, feeds), run_ort(result.path, feeds)
    assert cosine(ref, got) > 0.999
    assert trt_build(result.path, {"input": ((1, 4, 8, 8), (1, 4, 16, 16), (2, 4, 32, 32))}) > 0


def test_light_fp16_keeps_out_of_range_values_in_fp32(tmp_path: Path) -> None:
    source = make_large_intermediate(tmp_path / "large.onnx")
    result = convert_precision(source, LIGHT, tmp_path / "work", input_shapes={"input": (4, 8)})
    options = result.recipe["options"]
    assert isinstance(options, dict)
    assert set(options["node_block_list"]) == {"scale_const", "scale_up", "scale_down"}
    assert any("kept in fp32, their inputs or outputs past 8192" in w for w in result.warnings)
    feeds = {"input": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    (ref,), (got,) = run_ort(source, feeds), run_ort(result.path, feeds)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_light_fp16_gives_fp32_nodes_their_own_copy_of_a_shared_weight(tmp_path: Path) -> None:
    source = make_shared_initializer(tmp_path / "shared.onnx")
    result = convert_precision(source, LIGHT, tmp_path / "work")
    model = onnx.load(str(result.path))
    inits = {init.name: init.data_type for init in model.graph.initializer}
    assert inits == {"c": TensorProto.FLOAT16, "c_ec_fp32": TensorProto.FLOAT}
    feeds = {"input": np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)}
    (ref,), (got,) = run_ort(source, feeds), run_ort(result.path, feeds)
    np.testing.assert_allclose(got, ref, rtol=1e-2, atol=1e-2)


def test_run_check_fails_a_model_that_loads_but_does_not_run(mlp: Path, tmp_path: Path) -> None:
    broken = onnx.load(str(mlp))
    broken.graph.initializer.append(onnx.numpy_helper.from_array(np.array([7, 5], np.int64), "bad_shape"))
    broken.graph.node[-1].output[0] = "flat"
    broken.graph.node.append(onnx.helper.make_node("Reshape", ["flat", "bad_shape"], ["output"], name="bad_reshape"))
    del broken.graph.output[:]
    broken.graph.output.append(onnx.helper.make_tensor_value_info("output", TensorProto.FLOAT, ["rows", "cols"]))
    converted = tmp_path / "mlp.fp16.onnx"
    onnx.save(broken, str(converted))
    assert validate_model(converted) == (), "it loads"
    with pytest.raises(PrecisionError) as caught:
        run_check(mlp, converted, {"input": (2, 16)}, converter="a converter")
    message = str(caught.value)
    assert "mlp.fp16.onnx (made by a converter) is not a valid model: onnxruntime run failed" in message
    assert "at node 'bad_reshape' (Reshape)" in message
