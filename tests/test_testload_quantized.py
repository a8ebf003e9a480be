"""The test-load of an already-quantized model built as is (fp32, what a quantized model builds at):
with its graph optimizations off ONNX Runtime runs each DequantizeLinear -> float op ->
QuantizeLinear in float, which rounds differently from the integer kernels its optimizer fuses them
into (here a QLinearAveragePool: a whole quantization step on some elements), and fp32's tolerance
made an engine equal to plain ONNX Runtime FAIL. Such an engine is judged at its quantized
arithmetic's tolerances (int8's) against ONNX Runtime at ORT_ENABLE_ALL, and the verdict says so;
an engine of other weights still FAILs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import helper, numpy_helper

from enginecache.core.accuracy import REFERENCE_PATH, REFERENCE_PATH_QUANTIZED, reference_outputs
from enginecache.core.backends.base import BuildSpec, TensorIO
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.hashing import hash_file
from enginecache.core.onnx_info import inspect_model
from enginecache.core.profiles import resolve_profile
from enginecache.core.tolerances import DEFAULT_TOLERANCES
from enginecache.core.validate import FAIL, PASS, TestLoadSpec, source_arithmetic, validate_engine
from enginecache.db.models import EngineStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.modelfactory import _save_float_graph, make_conv, quantize_with_ort

SHAPE = (1, 3, 32, 32)


def make_conv_pool(path: Path, *, seed: int = 0) -> Path:
    """`input[batch, 3, 32, 32] -> output[batch, 16, 16, 16]`: two convs, then a 2x2 AveragePool
    (which ONNX Runtime's optimizer turns into a QLinearAveragePool once the model is quantized)."""
    rng = np.random.default_rng(seed)
    w1 = numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32), "w1")
    w2 = numpy_helper.from_array((rng.standard_normal((16, 16, 3, 3)) * 0.1).astype(np.float32), "w2")
    nodes = [
        helper.make_node("Conv", ["input", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["c1", "w2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("AveragePool", ["c2"], ["output"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
    ]
    return _save_float_graph(path, "conv_pool", nodes, ["batch", 3, 32, 32], ["batch", 16, 16, 16], [w1, w2])


def _quantized(folder: Path, seed: int = 0) -> Path:
    return quantize_with_ort(make_conv_pool(folder / f"f{seed}.onnx", seed=seed), folder / f"q{seed}.onnx")


def test_the_reference_of_a_quantized_model_differs_unoptimized_and_is_exact_optimized(tmp_path: Path) -> None:
    """The premise: what the unoptimized reference does to this model, and that ORT_ENABLE_ALL
    gives what an ORT engine gives."""
    source = _quantized(tmp_path)
    feeds = {"input": np.random.default_rng(5).standard_normal(SHAPE).astype(np.float32)}
    plain = reference_outputs(source, feeds)["output"]
    optimized = reference_outputs(source, feeds, quantized=True)["output"]
    differ = np.abs(plain - optimized)
    assert int((differ > 0).sum()) >= 10 and float(differ.max()) > 1e-3
    assert source_arithmetic(source) == "int8" and source_arithmetic(make_conv(tmp_path / "float.onnx")) is None


def test_an_as_is_engine_of_a_quantized_model_passes_its_own_test_load(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, _quantized(tmp_path), name="qpool")
    engine = build_engine(app_ctx, BuildRequest(model="qpool", backend="ort", precision="fp32")).engine
    assert engine.status == EngineStatus.READY
    run = run_test_load(app_ctx, engine.id or 0, iterations=1)
    assert run.verdict == PASS, run.reason
    assert "within int8 tolerances" in run.reason and "the source is already quantized (int8)" in run.reason
    assert "ORT_ENABLE_ALL" in run.reason
    assert run.tolerances == DEFAULT_TOLERANCES["int8"].to_dict()
    overridden = run_test_load(app_ctx, engine.id or 0, iterations=1, tolerances={"min_cosine": 0.9})
    assert overridden.tolerances == {**DEFAULT_TOLERANCES["int8"].to_dict(), "min_cosine": 0.9}


def test_an_engine_of_other_weights_still_fails_against_a_quantized_source(tmp_path: Path) -> None:
    source, other = _quantized(tmp_path, seed=0), _quantized(tmp_path, seed=1)
    profile = resolve_profile(inspect_model(source).inputs, {})
    io = (
        TensorIO("input", "input", "float32", ("batch", 3, 32, 32)),
        TensorIO("output", "output", "float32", ("batch", 16, 16, 16)),
    )
    profiles = {"input": {"min": list(SHAPE), "opt": list(SHAPE), "max": list(SHAPE)}}

    def test_load(model: Path, name: str) -> dict[str, object]:
        engine = ORT_BACKEND.build(BuildSpec(model, ("x86_64",), profile), tmp_path / name).engine_path
        spec = TestLoadSpec(engine, hash_file(engine).sha256, source, io, profiles, "fp32", iterations=1)
        return validate_engine(ORT_BACKEND, spec).to_dict()

    faithful, broken = test_load(source, "q0.ort"), test_load(other, "q1.ort")
    assert faithful["verdict"] == PASS and faithful["details"]["reference"] == REFERENCE_PATH_QUANTIZED
    assert broken["verdict"] == FAIL, broken["reason"]
    assert "outside int8 tolerances" in str(broken["reason"]) and REFERENCE_PATH != REFERENCE_PATH_QUANTIZED
