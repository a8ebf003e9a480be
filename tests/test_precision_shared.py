"""Precision recipes on the shared reference models (../shared/models): the heavy claims."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from enginecache.core.hashing import sha256_file
from enginecache.core.precision import PrecisionSpec, convert_precision
from tests.conftest import shared_model
from tests.precisionkit import (
    IMAGE_PROFILE,
    TOKEN_PROFILE,
    UNCALIBRATED,
    cosine,
    need_modelopt,
    run_ort,
    trt_build,
)

pytestmark = pytest.mark.shared


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


def _assert_matches_and_builds(source: Path, converted: Path) -> None:
    """The converted token model answers as the fp32 source does (cosine > 0.999) and TensorRT builds it."""
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 100, (1, 16)).astype(np.int64), "attention_mask": np.ones((1, 16), np.int64)}
    (ref,), (got,) = run_ort(source, feeds), run_ort(converted, feeds)
    assert cosine(ref, got) > 0.999
    assert trt_build(converted, TOKEN_PROFILE) > 0


def test_shared_tiny_llama_light_fp16_matches_fp32(tmp_path: Path, no_modelopt: None) -> None:
    """onnxconverter-common alone leaves the rotary embedding's Cast(to=FLOAT) typed float16 (an
    invalid graph); with the repair the default install converts Llama and TRT-RTX builds it."""
    source = shared_model("tiny_llama.onnx")
    result = convert_precision(source, PrecisionSpec("fp16"), tmp_path / "work")
    assert result.recipe["tool"] == "onnxconverter_common.float16"
    model = onnx.load(str(result.path))
    rotary = [n for n in model.graph.node if n.op_type == "Cast" and n.name.startswith("/model/model/rotary_emb/")]
    assert rotary and all(n.attribute[0].i == TensorProto.FLOAT16 for n in rotary)
    _assert_matches_and_builds(source, result.path)


def test_shared_tiny_llama_autocast_fp16_matches_fp32(tmp_path: Path) -> None:
    source = shared_model("tiny_llama.onnx")
    need_modelopt()
    result = convert_precision(source, PrecisionSpec("fp16"), tmp_path / "work")
    assert result.recipe["tool"] == "modelopt.autocast"
    _assert_matches_and_builds(source, result.path)


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


def test_shared_mobilenet_int8_random_and_npz(tmp_path: Path) -> None:
    source = shared_model("mobilenet_v3_small.onnx")
    need_modelopt()
    uncalibrated = convert_precision(source, PrecisionSpec("int8"), tmp_path / "rand")
    assert uncalibrated.recipe["tool"] == "modelopt.onnx.quantization"
    assert any(w.startswith(UNCALIBRATED) for w in uncalibrated.warnings)
    assert trt_build(uncalibrated.path, IMAGE_PROFILE) > 0
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(7).standard_normal((4, 3, 224, 224)).astype(np.float32))
    calibrated = convert_precision(source, PrecisionSpec("int8", calibration=calib), tmp_path / "npz")
    assert not any(w.startswith(UNCALIBRATED) for w in calibrated.warnings)
    assert calibrated.recipe["calibration_samples"] == 4
    assert calibrated.recipe["calibration_digest"] == sha256_file(calib)
    # ModelOpt keeps weights in float behind Q/DQ (TensorRT folds them at build): no smaller ONNX
    assert trt_build(calibrated.path, IMAGE_PROFILE) > 0


@pytest.mark.parametrize("family", ["tensorrt", "ort"])
def test_shared_bert_mini_int8_builds(tmp_path: Path, family: str) -> None:
    if family == "tensorrt":
        need_modelopt()
    source = shared_model("bert_mini.onnx")
    result = convert_precision(
        source,
        PrecisionSpec("int8", backend_family=family),
        tmp_path / "work",
        input_shapes={"input_ids": (1, 16), "attention_mask": (1, 16)},
    )
    assert trt_build(result.path, TOKEN_PROFILE) > 0
