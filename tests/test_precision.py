"""Precision recipes (core.precision, core.calibration): fp32/fp16/bf16/int8/fp8 on real models."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from enginecache.core.calibration import (
    DEFAULT_DYNAMIC_DIM,
    ModelInput,
    batch_arrays,
    load_calibration,
    random_batches,
    read_model_inputs,
)
from enginecache.core.hashing import sha256_file
from enginecache.core.precision import PRECISIONS, PrecisionSpec, availability, convert_precision, validate_model
from enginecache.errors import CalibrationError, PrecisionError
from tests.conftest import shared_model, skip_or_fail
from tests.modelfactory import make_conv, make_mlp

REPO = Path(__file__).resolve().parents[1]
UNCALIBRATED = "uncalibrated"
IMAGE_PROFILE = {"input": ((1, 3, 224, 224), (1, 3, 224, 224), (4, 3, 224, 224))}
TOKEN_PROFILE = {
    "input_ids": ((1, 1), (1, 16), (4, 64)),
    "attention_mask": ((1, 1), (1, 16), (4, 64)),
}


def need_modelopt() -> None:
    if not availability.modelopt_available():
        skip_or_fail("NVIDIA ModelOpt is not installed: pip install 'enginecache[modelopt]'")


def trt_build(path: Path, profile: Mapping[str, tuple[tuple[int, ...], ...]]) -> int:
    """Parse and build with TensorRT for RTX on this machine (no GPU needed); the engine's bytes."""
    try:
        import tensorrt_rtx as trt
    except ImportError:
        skip_or_fail("tensorrt_rtx is not installed")
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    ok = parser.parse_from_file(str(path))
    errors = [parser.get_error(i).desc() for i in range(parser.num_errors)]
    assert ok, errors
    config = builder.create_builder_config()
    opt_profile = builder.create_optimization_profile()
    for name, (low, opt, high) in profile.items():
        opt_profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(opt_profile)
    blob = builder.build_serialized_network(network, config)
    assert blob is not None, "TensorRT-RTX refused to build the engine"
    return int(blob.nbytes)


def run_ort(path: Path, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [np.asarray(out) for out in session.run(None, dict(feeds))]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def op_types(path: Path) -> set[str]:
    return {node.op_type for node in onnx.load(str(path), load_external_data=False).graph.node}


def io_types(path: Path) -> list[int]:
    graph = onnx.load(str(path), load_external_data=False).graph
    return [v.type.tensor_type.elem_type for v in [*graph.input, *graph.output]]


def assert_recipe_shape(recipe: Mapping[str, object]) -> None:
    assert set(recipe) == {
        "name",
        "tool",
        "tool_version",
        "options",
        "calibration",
        "calibration_digest",
        "calibration_samples",
    }
    json.dumps(recipe, sort_keys=True)  # JSON-safe, as the cache key needs


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    return make_mlp(tmp_path / "src" / "mlp.onnx")


@pytest.fixture
def conv(tmp_path: Path) -> Path:
    return make_conv(tmp_path / "src" / "conv.onnx")


@pytest.fixture
def no_modelopt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(availability, "modelopt_available", lambda: False)


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
    code = (
        "import sys, enginecache.core.precision, enginecache.core.calibration\n"
        "heavy = ['torch', 'modelopt', 'tensorrt_rtx', 'tensorrt', 'onnxruntime', 'onnxconverter_common']\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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
    assert result.recipe["options"] == {"keep_io_types": True, "min_positive_val": 1e-7, "max_finite_val": 1e4}
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


def test_fp16_autocast_small_model(conv: Path, tmp_path: Path) -> None:
    need_modelopt()
    result = convert_precision(conv, PrecisionSpec("fp16"), tmp_path / "work")
    assert result.recipe["tool"] == "modelopt.autocast"
    assert result.recipe["options"] == {"low_precision_type": "fp16", "keep_io_types": True, "providers": ["cpu"]}
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


# --- int8 / fp8 ----------------------------------------------------------------------------


def test_int8_random_calibration_warns(conv: Path, tmp_path: Path) -> None:
    result = convert_precision(conv, PrecisionSpec("int8"), tmp_path / "work")
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
    result = convert_precision(model, PrecisionSpec("int8", calibration=calib), tmp_path / "work")
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
    result = convert_precision(mlp, PrecisionSpec("fp8"), tmp_path / "work")
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
    result = convert_precision(conv, PrecisionSpec("int8"), tmp_path / "work", input_shapes={"input": (2, 3, 32, 32)})
    options = result.recipe["options"]
    assert isinstance(options, dict) and options["random_shapes"] == {"input": [2, 3, 32, 32]}
    assert result.recipe["calibration_samples"] == 8
    with pytest.raises(PrecisionError, match=r"input_shapes names \['pixels'\]"):
        convert_precision(conv, PrecisionSpec("int8"), tmp_path / "w2", input_shapes={"pixels": (1, 3, 32, 32)})
    with pytest.raises(PrecisionError, match="does not fit model input"):
        convert_precision(conv, PrecisionSpec("int8"), tmp_path / "w3", input_shapes={"input": (1, 3, 64, 64)})


# --- calibration data ----------------------------------------------------------------------

TOKEN_INPUTS = (
    ModelInput("input_ids", TensorProto.INT64, ("batch", "seq")),
    ModelInput("attention_mask", TensorProto.INT64, ("batch", "seq")),
    ModelInput("pixels", TensorProto.FLOAT, ("batch", 3, 8, 8)),
)


def _npz(tmp_path: Path, **arrays: np.ndarray) -> Path:
    path = tmp_path / "calib.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _good_arrays() -> dict[str, np.ndarray]:
    return {
        "input_ids": np.zeros((5, 7), np.int32),
        "attention_mask": np.ones((5, 7), np.int64),
        "pixels": np.zeros((5, 3, 8, 8), np.float32),
    }


def test_load_calibration_casts_to_input_dtypes(tmp_path: Path) -> None:
    arrays = load_calibration(_npz(tmp_path, **_good_arrays()), TOKEN_INPUTS)
    assert arrays["input_ids"].dtype == np.int64 and arrays["pixels"].dtype == np.float32
    assert len(batch_arrays(arrays, TOKEN_INPUTS)) == 1  # dynamic batch: one feed of all samples


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ("missing", r"missing arrays for model inputs \['attention_mask'\]"),
        ("extra", r"extra arrays \['labels'\] that are not model inputs"),
        ("rank", r"array 'pixels' has rank 3 .* model input 'pixels' has rank 4"),
        ("dtype", r"array 'input_ids' has dtype float32 but model input 'input_ids' is int64"),
        ("static_dim", r"array 'pixels' has shape \[5, 3, 9, 8\]"),
        ("count", r"different sample counts"),
    ],
)
def test_load_calibration_errors_name_the_array(tmp_path: Path, change: str, pattern: str) -> None:
    arrays = _good_arrays()
    if change == "missing":
        del arrays["attention_mask"]
    elif change == "extra":
        arrays["labels"] = np.zeros(5, np.int64)
    elif change == "rank":
        arrays["pixels"] = np.zeros((3, 8, 8), np.float32)
    elif change == "dtype":
        arrays["input_ids"] = np.zeros((5, 7), np.float32)
    elif change == "static_dim":
        arrays["pixels"] = np.zeros((5, 3, 9, 8), np.float32)
    else:
        arrays["input_ids"] = np.zeros((4, 7), np.int64)
    with pytest.raises(CalibrationError, match=pattern):
        load_calibration(_npz(tmp_path, **arrays), TOKEN_INPUTS)


def test_calibration_error_through_convert(mlp: Path, tmp_path: Path) -> None:
    calib = _npz(tmp_path, inputs=np.zeros((4, 16), np.float32))
    with pytest.raises(
        CalibrationError, match=r"missing arrays for model inputs \['input'\]; extra arrays \['inputs'\]"
    ):
        convert_precision(mlp, PrecisionSpec("int8", calibration=calib), tmp_path / "work")
    assert not list((tmp_path / "work").glob("*.onnx"))


def test_calibration_file_not_npz(mlp: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "calib.npz"
    bogus.write_text("hello")
    with pytest.raises(CalibrationError, match=r"not a readable \.npz"):
        convert_precision(mlp, PrecisionSpec("int8", calibration=bogus), tmp_path / "work")
    with pytest.raises(CalibrationError, match="does not exist"):
        convert_precision(mlp, PrecisionSpec("int8", calibration=tmp_path / "none.npz"), tmp_path / "work")


def test_static_batch_must_divide_samples(tmp_path: Path) -> None:
    inputs = (ModelInput("x", TensorProto.FLOAT, (4, 2)),)
    arrays = load_calibration(_npz(tmp_path, x=np.zeros((6, 2), np.float32)), inputs)
    with pytest.raises(CalibrationError, match="not a multiple of the model's static batch size 4"):
        batch_arrays(arrays, inputs)


def test_random_batches_follow_the_documented_rules() -> None:
    feeds = random_batches(TOKEN_INPUTS, {"pixels": (2, 3, 8, 8)}, batches=2)
    assert len(feeds) == 2
    feed = feeds[0]
    assert feed["input_ids"].shape == (1, DEFAULT_DYNAMIC_DIM) and feed["input_ids"].dtype == np.int64
    assert feed["input_ids"].min() >= 0 and feed["input_ids"].max() < 100
    assert (feed["attention_mask"] == 1).all()
    assert feed["pixels"].shape == (2, 3, 8, 8) and feed["pixels"].dtype == np.float32
    again = random_batches(TOKEN_INPUTS, {"pixels": (2, 3, 8, 8)}, batches=2)
    assert np.array_equal(again[1]["pixels"], feeds[1]["pixels"])  # seeded: reproducible recipe


def test_read_model_inputs_skips_initializers_listed_as_inputs(tmp_path: Path) -> None:
    path = make_mlp(tmp_path / "mlp.onnx")
    model = onnx.load(str(path))
    model.graph.input.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [16, 32]))  # IR<4 style
    onnx.save(model, str(path))
    assert read_model_inputs(path) == (ModelInput("input", TensorProto.FLOAT, ("batch", 16)),)


# --- shared reference models (the heavy claims) --------------------------------------------


@pytest.mark.shared
def test_shared_resnet18_fp16_both_converters_build(tmp_path: Path) -> None:
    source = shared_model("resnet18.onnx")
    light = convert_precision(source, PrecisionSpec("fp16", converter="onnxconverter"), tmp_path / "oc")
    assert light.path.stat().st_size < source.stat().st_size * 0.55
    assert trt_build(light.path, IMAGE_PROFILE) > 0
    need_modelopt()
    autocast = convert_precision(source, PrecisionSpec("fp16", converter="modelopt"), tmp_path / "mo")
    assert autocast.recipe["tool"] == "modelopt.autocast"
    x = {"input": np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    (ref,), (a,), (b,) = run_ort(source, x), run_ort(light.path, x), run_ort(autocast.path, x)
    assert cosine(ref, a) > 0.999 and cosine(ref, b) > 0.999


@pytest.mark.shared
def test_shared_tiny_llama_onnxconverter_fails_naming_the_node(tmp_path: Path, no_modelopt: None) -> None:
    source = shared_model("tiny_llama.onnx")
    with pytest.raises(PrecisionError) as caught:
        convert_precision(source, PrecisionSpec("fp16"), tmp_path / "work")
    message = str(caught.value)
    assert "at node '/model/model/rotary_emb/" in message
    assert "install the modelopt extra: pip install 'enginecache[modelopt]'" in message
    assert not list((tmp_path / "work").glob("*.onnx"))  # no invalid artifact left behind


@pytest.mark.shared
def test_shared_tiny_llama_autocast_fp16_matches_fp32(tmp_path: Path) -> None:
    source = shared_model("tiny_llama.onnx")
    need_modelopt()
    result = convert_precision(source, PrecisionSpec("fp16"), tmp_path / "work")
    assert result.recipe["tool"] == "modelopt.autocast"
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 100, (1, 16)).astype(np.int64), "attention_mask": np.ones((1, 16), np.int64)}
    (ref,), (got,) = run_ort(source, feeds), run_ort(result.path, feeds)
    assert cosine(ref, got) > 0.999
    assert trt_build(result.path, TOKEN_PROFILE) > 0


@pytest.mark.shared
def test_shared_resnet18_bf16_autocast(tmp_path: Path) -> None:
    source = shared_model("resnet18.onnx")
    need_modelopt()
    result = convert_precision(source, PrecisionSpec("bf16"), tmp_path / "work")
    assert result.recipe["tool"] == "modelopt.autocast" and result.recipe["name"] == "bf16"
    model = onnx.load(str(result.path))
    assert TensorProto.BFLOAT16 in {init.data_type for init in model.graph.initializer}
    # ORT's CPU build has no bf16 Conv kernel: the graph passed its type checks, which is noted.
    assert any("onnxruntime CPU cannot run" in w for w in result.warnings)
    assert trt_build(result.path, IMAGE_PROFILE) > 0


@pytest.mark.shared
def test_shared_mobilenet_int8_random_and_npz(tmp_path: Path) -> None:
    source = shared_model("mobilenet_v3_small.onnx")
    uncalibrated = convert_precision(source, PrecisionSpec("int8"), tmp_path / "rand")
    assert any(w.startswith(UNCALIBRATED) for w in uncalibrated.warnings)
    assert trt_build(uncalibrated.path, IMAGE_PROFILE) > 0
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(7).standard_normal((4, 3, 224, 224)).astype(np.float32))
    calibrated = convert_precision(source, PrecisionSpec("int8", calibration=calib), tmp_path / "npz")
    assert not any(w.startswith(UNCALIBRATED) for w in calibrated.warnings)
    assert calibrated.recipe["calibration_samples"] == 4
    assert calibrated.recipe["calibration_digest"] == sha256_file(calib)
    assert calibrated.path.stat().st_size < source.stat().st_size * 0.4


@pytest.mark.shared
def test_shared_bert_mini_int8_builds(tmp_path: Path) -> None:
    source = shared_model("bert_mini.onnx")
    result = convert_precision(
        source, PrecisionSpec("int8"), tmp_path / "work", input_shapes={"input_ids": (1, 16), "attention_mask": (1, 16)}
    )
    assert trt_build(result.path, TOKEN_PROFILE) > 0
