"""int8/fp8 by backend family: NVIDIA ModelOpt's ONNX PTQ for TensorRT backends (built here with
TensorRT for RTX), onnxruntime.quantization for the ONNX Runtime backend; the recipe identity
(the cache key's precision part) names the family and the tool."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from enginecache.core.backends.registry import get_backend
from enginecache.core.precision import PrecisionSpec, convert_precision, plan_recipe
from enginecache.errors import PrecisionError
from tests.modelfactory import file_sha256
from tests.precisionkit import (
    UNCALIBRATED,
    assert_recipe_shape,
    cosine,
    need_modelopt,
    op_types,
    run_ort,
    trt_build,
)

CONV_PROFILE = {"input": ((1, 3, 32, 32), (2, 3, 32, 32), (4, 3, 32, 32))}


def test_backends_name_their_precision_family() -> None:
    assert get_backend("rtx").precision_family == "tensorrt"
    assert get_backend("trt").precision_family == "tensorrt"
    assert get_backend("ort").precision_family == "ort"


def test_unknown_backend_family_is_refused() -> None:
    with pytest.raises(PrecisionError, match="unknown backend family 'xla'; choose one of tensorrt, ort"):
        PrecisionSpec("int8", backend_family="xla")


def test_modelopt_int8_conv_builds_with_tensorrt_rtx(conv: Path, tmp_path: Path) -> None:
    need_modelopt()
    result = convert_precision(
        conv,
        PrecisionSpec("int8", backend_family="tensorrt"),
        tmp_path / "work",
        input_shapes={"input": (2, 3, 32, 32)},
    )
    recipe = result.recipe
    assert recipe["tool"] == "modelopt.onnx.quantization" and recipe["backend_family"] == "tensorrt"
    assert recipe["tool_version"]
    assert_recipe_shape(recipe)
    options = recipe["options"]
    assert isinstance(options, dict)
    assert options["quantize_mode"] == "int8" and options["high_precision_dtype"] == "fp32"
    assert options["calibration_eps"] == ["cpu"]
    assert options["random_shapes"] == {"input": [2, 3, 32, 32]}
    assert isinstance(options["qdq_nodes"], int) and options["qdq_nodes"] > 0
    assert recipe["calibration"] == "random" and recipe["calibration_samples"] == 8
    assert any(w.startswith(f"{UNCALIBRATED}: int8") for w in result.warnings)
    assert {"QuantizeLinear", "DequantizeLinear"} <= op_types(result.path)
    assert not list((tmp_path / "work").glob("*ptq-source*")), "the staged source is cleaned up"
    x = {"input": np.random.default_rng(5).standard_normal((2, 3, 32, 32)).astype(np.float32)}
    (ref,), (got,) = run_ort(conv, x), run_ort(result.path, x)
    assert cosine(ref, got) > 0.98
    assert trt_build(result.path, CONV_PROFILE) > 0


def test_modelopt_int8_with_npz_calibration(conv: Path, tmp_path: Path) -> None:
    need_modelopt()
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(3).standard_normal((6, 3, 32, 32)).astype(np.float32))
    result = convert_precision(conv, PrecisionSpec("int8", calibration=calib), tmp_path / "work")
    assert result.recipe["calibration"] == "npz" and result.recipe["calibration_samples"] == 6
    assert not any(w.startswith(UNCALIBRATED) for w in result.warnings)
    assert trt_build(result.path, CONV_PROFILE) > 0


def test_ort_backend_int8_stays_onnxruntime_quantization(conv: Path, tmp_path: Path) -> None:
    result = convert_precision(conv, PrecisionSpec("int8", backend_family="ort"), tmp_path / "work")
    assert result.recipe["tool"] == "onnxruntime.quantization" and result.recipe["backend_family"] == "ort"
    options = result.recipe["options"]
    assert isinstance(options, dict) and options["quant_format"] == "QDQ"
    x = {"input": np.random.default_rng(5).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    (ref,), (got,) = run_ort(conv, x), run_ort(result.path, x)
    assert cosine(ref, got) > 0.98


def test_ort_int8_needs_no_modelopt(conv: Path, tmp_path: Path, no_modelopt: None) -> None:
    result = convert_precision(conv, PrecisionSpec("int8", backend_family="ort"), tmp_path / "work")
    assert result.recipe["tool"] == "onnxruntime.quantization"


@pytest.mark.parametrize("precision", ["int8", "fp8"])
def test_tensorrt_int8_without_modelopt_names_the_extra(
    conv: Path, tmp_path: Path, no_modelopt: None, precision: str
) -> None:
    pattern = (
        rf"{precision} for a TensorRT backend quantizes with NVIDIA ModelOpt.*pip install 'enginecache\[modelopt\]'"
    )
    with pytest.raises(PrecisionError, match=pattern):
        plan_recipe(PrecisionSpec(precision, backend_family="tensorrt"))
    with pytest.raises(PrecisionError, match=pattern):
        convert_precision(conv, PrecisionSpec(precision, backend_family="tensorrt"), tmp_path / "work")
    assert not list((tmp_path / "work").glob("*.onnx"))


def test_recipe_identity_names_the_family_and_tool() -> None:
    need_modelopt()
    shapes = {"input": (2, 3, 32, 32)}
    trt = plan_recipe(PrecisionSpec("int8", backend_family="tensorrt"), input_shapes=shapes)
    ort = plan_recipe(PrecisionSpec("int8", backend_family="ort"), input_shapes=shapes)
    assert trt["backend_family"] == "tensorrt" and trt["tool"] == "modelopt.onnx.quantization"
    assert ort["backend_family"] == "ort" and ort["tool"] == "onnxruntime.quantization"
    assert trt != ort, "the family is part of the cache key"
    assert trt["random_shapes"] == ort["random_shapes"] == {"input": [2, 3, 32, 32]}
    # fp16/bf16 and fp32 are the same for every backend: one converted variant serves both
    for precision in ("fp32", "fp16"):
        a = plan_recipe(PrecisionSpec(precision, backend_family="tensorrt"), input_shapes=shapes)
        b = plan_recipe(PrecisionSpec(precision, backend_family="ort"), input_shapes=shapes)
        assert a == b and "backend_family" not in a


def test_modelopt_fp8_mlp_builds(tmp_path: Path) -> None:
    """fp8 Q/DQ for a GEMM large enough for ModelOpt to quantize (K, N >= 16)."""
    need_modelopt()
    from tests.modelfactory import make_mlp

    source = make_mlp(tmp_path / "mlp.onnx", features=64, hidden=64)
    result = convert_precision(source, PrecisionSpec("fp8"), tmp_path / "work", input_shapes={"input": (32, 64)})
    assert result.recipe["tool"] == "modelopt.onnx.quantization"
    model = onnx.load(str(result.path))
    assert onnx.TensorProto.FLOAT8E4M3FN in {init.data_type for init in model.graph.initializer}
    assert trt_build(result.path, {"input": ((1, 64), (32, 64), (64, 64))}) > 0


@pytest.mark.parametrize(
    "spec",
    [
        PrecisionSpec("int8", backend_family="tensorrt"),
        PrecisionSpec("int8", backend_family="ort"),
        PrecisionSpec("fp16", converter="modelopt"),
        PrecisionSpec("fp16", converter="onnxconverter"),
    ],
    ids=["modelopt-ptq", "ort-quant", "autocast", "onnxconverter"],
)
def test_converters_never_write_the_source_or_beside_it(conv: Path, tmp_path: Path, spec: PrecisionSpec) -> None:
    """ModelOpt's PTQ rewrites its input in place (`infer_shapes_path(onnx_path)`) and ORT writes
    `<model>-inferred.onnx` beside it: the source, a file in the content-addressed store, must not
    change, and nothing may appear in its folder."""
    if spec.converter == "modelopt" or (spec.backend_family == "tensorrt" and spec.precision == "int8"):
        need_modelopt()
    before = file_sha256(conv)
    listing = sorted(p.name for p in conv.parent.iterdir())
    convert_precision(conv, spec, tmp_path / "work")
    assert file_sha256(conv) == before
    assert sorted(p.name for p in conv.parent.iterdir()) == listing
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == [f"conv.{spec.precision}.onnx"]
