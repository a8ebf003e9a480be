"""Helpers for the precision tests: build with TensorRT-RTX, run ONNX Runtime, compare outputs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from enginecache.core.precision import availability
from tests.conftest import skip_or_fail

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
    assert set(recipe) - {"backend_family"} == {
        "name",
        "tool",
        "tool_version",
        "options",
        "calibration",
        "calibration_digest",
        "calibration_samples",
    }
    json.dumps(recipe, sort_keys=True)  # JSON-safe, as the cache key needs
