"""Precision recipes (core.precision): fp32/fp16/bf16/int8/fp8 on small real models (calibration data
and the shared reference models have files of their own)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from enginecache.core.hashing import sha256_file
from enginecache.core.precision import PRECISIONS, PrecisionSpec, convert_precision, validate_model
from enginecache.errors import PrecisionError
from tests.modelfactory import make_mlp
from tests.precisionkit import (
    UNCALIBRATED,
    assert_recipe_shape,
    cosine,
    io_types,
    need_modelopt,
    op_types,
    run_ort,
    trt_build,
)
from tests.servingkit import loaded_modules

REPO = Path(__file__).resolve().parents[1]


# --- specs ---------------------------------------------------------------------------------


def test_unknown_precision_names_the_choices() -> None:
    with pytest.raises(PrecisionError, match=r"unknown precision 'int4'; choose one of fp32, fp16, bf16, int8, fp8"):
        PrecisionSpec("int4")
    assert PRECISIONS == ("fp32", "fp16", "bf16", "int8", "fp8")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision": "fp16", "converter": "tf2onnx"}, "unknown converter 'tf2onnx'"),
        ({"precision": "int8", "converter": "modelopt"}, "applies to fp16 only"),
        ({"precision": "bf16", "converter": "onnxconverter"}, "bf16 converts only through"),
        ({"precision": "fp16", "calibration": Path("x.npz")}, "calibration data applies to int8/fp8 only"),
    ],
)
def test_spec_rejects_options_that_do_not_apply(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(PrecisionError, match=message):
        PrecisionSpec(**kwargs)  # type: ignore[arg-type]


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(PrecisionError, match="does not exist"):
        convert_precision(tmp_path / "nope.onnx", PrecisionSpec("fp16"), tmp_path / "work")


def test_importing_core_precision_loads_no_heavy_library() -> None:
    heavy = ("torch", "modelopt", "tensorrt_rtx", "tensorrt", "onnxruntime", "onnxconverter_common")
    assert loaded_modules("import enginecache.core.precision, enginecache.core.calibration", *heavy) == []


# --- fp32 / fp16 / bf16 --------------------------------------------------------------------


def test_fp32_is_the_source_itself(mlp: Path, tmp_path: Path) -> None:
    result = convert_precision(mlp, PrecisionSpec("fp32"), tmp_path / "work")
    assert result.path == mlp
    assert not result.converted
    assert result.recipe["name"] == "fp32" and result.recipe["tool"] == "none"
    assert_recipe_shape(result.recipe)
    assert not (tmp_path / "work").exists()


def test_fp16_onnxconverter_small_model(mlp: Path, tmp_path: Path) -> None:
    result = convert_precision(mlp, PrecisionSpec("fp16", converter="onnxconverter"), tmp_path / "work")
    assert result.converted and result.path == tmp_path / "work" / "mlp.fp16.onnx"
    assert result.recipe["tool"] == "onnxconverter_common.float16"
    assert result.recipe["tool_version"]
    options = result.recipe["options"]
    assert isinstance(options, dict)
    assert {k: options[k] for k in ("keep_io_types", "min_positive_val", "max_finite_val")} == {
        "keep_io_types": True,
        "min_positive_val": 1e-7,
        "max_finite_val": 1e4,
    }
    assert "Resize" in options["op_block_list"] and options["node_block_list"] == []
    assert_recipe_shape(result.recipe)
    model = onnx.load(str(result.path))
    assert {init.data_type for init in model.graph.initializer} == {TensorProto.FLOAT16}
    assert io_types(result.path) == [TensorProto.FLOAT, TensorProto.FLOAT]  # keep_io_types
    x = {"input": np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)}
    (ref,), (got,) = run_ort(mlp, x), run_ort(result.path, x)
    assert cosine(ref, got) > 0.999


def test_fp16_auto_falls_back_to_onnxconverter(mlp: Path, tmp_path: Path, no_modelopt: None) -> None:
    result = convert_precision(mlp, PrecisionSpec("fp16"), tmp_path / "work")
    assert result.recipe["tool"] == "onnxconverter_common.float16"


def test_fp16_explicit_modelopt_unavailable(mlp: Path, tmp_path: Path, no_modelopt: None) -> None:
    with pytest.raises(PrecisionError, match=r"pip install 'enginecache\[modelopt\]'"):
        convert_precision(mlp, PrecisionSpec("fp16", converter="modelopt"), tmp_path / "work")


def test_bf16_needs_modelopt(mlp: Path, tmp_path: Path, no_modelopt: None) -> None:
    with pytest.raises(
        PrecisionError, match=r"bf16 needs NVIDIA ModelOpt AutoCast: pip install 'enginecache\[modelopt\]'"
    ):
        convert_precision(mlp, PrecisionSpec("bf16"), tmp_path / "work")


@pytest.mark.slow  # a real ModelOpt AutoCast conversion: torch and modelopt imported, seconds
def test_fp16_autocast_small_model(conv: Path, tmp_path: Path) -> None:
    need_modelopt()
    result = convert_precision(conv, PrecisionSpec("fp16"), tmp_path / "work")
    assert result.recipe["tool"] == "modelopt.autocast"
    options = result.recipe["options"]
    assert isinstance(options, dict)
    assert {k: options[k] for k in ("low_precision_type", "keep_io_types", "providers")} == {
        "low_precision_type": "fp16",
        "keep_io_types": True,
        "providers": ["cpu"],
    }
    assert options["reference_shapes"] == {"input": [1, 3, 32, 32]}  # dynamic batch: 1
    assert io_types(result.path) == [TensorProto.FLOAT, TensorProto.FLOAT]
    x = {"input": np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    (ref,), (got,) = run_ort(conv, x), run_ort(result.path, x)
    assert cosine(ref, got) > 0.999
    assert trt_build(result.path, {"input": ((1, 3, 32, 32), (1, 3, 32, 32), (4, 3, 32, 32))}) > 0


# --- validation ----------------------------------------------------------------------------


def _write_mixed_type_model(path: Path) -> Path:
    """A graph whose node `bad_add` adds float to float16: onnx and ORT both reject it."""
    half = numpy_helper.from_array(np.ones(4, np.float16), "half")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "half"], ["y"], name="bad_add")],
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
        initializer=[half],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_validate_model_names_the_node_and_the_hint(tmp_path: Path) -> None:
    bad = _write_mixed_type_model(tmp_path / "bad.onnx")
    with pytest.raises(PrecisionError) as caught:
        validate_model(bad, converter_hint="install the thing")
    message = str(caught.value)
    assert "at node 'bad_add'" in message
    assert message.endswith("; install the thing")


def test_validate_model_accepts_a_good_model(mlp: Path) -> None:
    assert validate_model(mlp) == ()


def test_validate_model_rejects_a_non_model(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a protobuf at all")
    with pytest.raises(PrecisionError, match="not a valid model"):
        validate_model(junk)


# --- int8 / fp8 for the ONNX Runtime backend (TensorRT's ModelOpt PTQ: test_precision_modelopt) ---


def test_int8_random_calibration_warns(conv: Path, tmp_path: Path) -> None:
    result = convert_precision(conv, PrecisionSpec("int8", backend_family="ort"), tmp_path / "work")
    assert result.path.name == "conv.int8.onnx"
    assert any(w.startswith(f"{UNCALIBRATED}: int8 scales come from random inputs") for w in result.warnings)
    recipe = result.recipe
    assert_recipe_shape(recipe)
    assert recipe["tool"] == "onnxruntime.quantization"
    assert recipe["calibration"] == "random" and recipe["calibration_digest"] is None
    assert recipe["calibration_samples"] == 4
    options = recipe["options"]
    assert isinstance(options, dict)
    assert options["activation_type"] == "QInt8" and options["calibrate_method"] == "MinMax"
    assert options["extra_options"] == {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}
    assert options["random_shapes"] == {"input": [1, 3, 32, 32]}
    assert {"QuantizeLinear", "DequantizeLinear"} <= op_types(result.path)
    model = onnx.load(str(result.path))
    assert TensorProto.INT32 not in {init.data_type for init in model.graph.initializer}  # bias stays float
    assert trt_build(result.path, {"input": ((1, 3, 32, 32), (1, 3, 32, 32), (4, 3, 32, 32))}) > 0


def test_int8_npz_calibration_static_batch(tmp_path: Path) -> None:
    model = make_mlp(tmp_path / "src" / "mlp.onnx", batch_dim=2)
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(3).standard_normal((6, 16)))  # float64: same kind, cast
    result = convert_precision(model, PrecisionSpec("int8", calibration=calib, backend_family="ort"), tmp_path / "work")
    assert not any(w.startswith(UNCALIBRATED) for w in result.warnings)
    assert result.recipe["calibration"] == "npz"
    assert result.recipe["calibration_digest"] == sha256_file(calib)
    assert result.recipe["calibration_samples"] == 6
    options = result.recipe["options"]
    assert isinstance(options, dict) and options["batches"] == 3  # split to the static batch of 2
    x = {"input": np.random.default_rng(4).standard_normal((2, 16)).astype(np.float32)}
    (ref,), (got,) = run_ort(model, x), run_ort(result.path, x)
    assert cosine(ref, got) > 0.99


def test_fp8_small_model(mlp: Path, tmp_path: Path) -> None:
    result = convert_precision(mlp, PrecisionSpec("fp8", backend_family="ort"), tmp_path / "work")
    options = result.recipe["options"]
    assert isinstance(options, dict)
    assert options["activation_type"] == "QFLOAT8E4M3FN" and options["weight_type"] == "QFLOAT8E4M3FN"
    assert options["calibrate_method"] == "Distribution"
    assert any(w.startswith(f"{UNCALIBRATED}: fp8") for w in result.warnings)
    model = onnx.load(str(result.path))
    assert TensorProto.FLOAT8E4M3FN in {init.data_type for init in model.graph.initializer}
    x = {"input": np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)}
    # ONNX's reference evaluator, not ORT: ORT 1.32's CPU fp8 Q/DQ results disagree with it
    # (cosine ~0.05-0.8 to fp32) on graphs the reference runs at cosine > 0.99.
    (ref,) = run_ort(mlp, x)
    (got,) = (np.asarray(out) for out in ReferenceEvaluator(str(result.path)).run(None, x))
    assert cosine(ref, got) > 0.99


def test_input_shapes_size_the_random_feeds(conv: Path, tmp_path: Path) -> None:
    ort_int8 = PrecisionSpec("int8", backend_family="ort")
    result = convert_precision(conv, ort_int8, tmp_path / "work", input_shapes={"input": (2, 3, 32, 32)})
    options = result.recipe["options"]
    assert isinstance(options, dict) and options["random_shapes"] == {"input": [2, 3, 32, 32]}
    assert result.recipe["calibration_samples"] == 8
    with pytest.raises(PrecisionError, match=r"input_shapes names \['pixels'\]"):
        convert_precision(conv, ort_int8, tmp_path / "w2", input_shapes={"pixels": (1, 3, 32, 32)})
    with pytest.raises(PrecisionError, match="does not fit model input"):
        convert_precision(conv, ort_int8, tmp_path / "w3", input_shapes={"input": (1, 3, 64, 64)})
