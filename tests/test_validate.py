"""core.validate and core.session: accuracy comparison, inputs, and the harness on real engines."""

from __future__ import annotations

import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from enginecache.core.backends.base import BuildSpec, LoadSpec, PhaseTimer, TensorIO
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.backends.trt import cuda as core_cuda
from enginecache.core.backends.trt.backend import RTX_BACKEND
from enginecache.core.backends.trt.session import TensorRTEngineSession
from enginecache.core.hashing import hash_file
from enginecache.core.onnx_info import inspect_model
from enginecache.core.profiles import resolve_profile
from enginecache.core.validate import (
    CORRUPT,
    DEFAULT_TOLERANCES,
    FAIL,
    INCOMPATIBLE,
    PASS,
    TestLoadSpec,
    compare_outputs,
    input_shapes,
    random_inputs,
    tolerances_for,
    validate_engine,
)
from enginecache.errors import TestInputError
from tests.conftest import corrupt_blob, leased_mapping
from tests.modelfactory import make_mlp

IO = (TensorIO("input", "input", "float32", ("batch", 16)), TensorIO("output", "output", "float32", ("batch", 32)))
PROFILES = {"input": {"min": [1, 16], "opt": [2, 16], "max": [8, 16]}}


def test_compare_outputs_reports_errors_and_verdict_per_output() -> None:
    ref = {"a": np.array([1.0, 2.0, 3.0], np.float32), "b": np.array([1.0, -1.0], np.float32)}
    close = {"a": ref["a"] + 1e-6, "b": ref["b"]}
    results = compare_outputs(close, ref, DEFAULT_TOLERANCES["fp32"])
    assert [r.name for r in results] == ["a", "b"]
    assert all(r.passed for r in results)
    assert results[0].max_abs == pytest.approx(1e-6, rel=0.1)
    far = {"a": ref["a"] * -1.0, "b": ref["b"] + 0.005}
    results = compare_outputs(far, ref, DEFAULT_TOLERANCES["fp32"])
    assert results[0].passed is False and results[0].cosine == pytest.approx(-1.0)
    assert results[1].passed is False  # 0.005 is outside fp32's tolerances ...
    assert compare_outputs(far, ref, DEFAULT_TOLERANCES["fp16"])[1].passed is True  # ... inside fp16's
    nan = {"a": np.array([np.nan, 2.0, 3.0], np.float32), "b": ref["b"]}
    assert compare_outputs(nan, ref, DEFAULT_TOLERANCES["int8"])[0].passed is False
    with pytest.raises(TestInputError, match="shape"):
        compare_outputs({"a": np.zeros(4), "b": ref["b"]}, ref, DEFAULT_TOLERANCES["fp32"])


def test_tolerances_are_per_precision_and_overridable() -> None:
    assert tolerances_for("fp32").atol < tolerances_for("fp16").atol < tolerances_for("int8").atol
    assert tolerances_for("fp16", {"min_cosine": 0.5}).min_cosine == 0.5
    with pytest.raises(TestInputError, match="unknown tolerance"):
        tolerances_for("fp16", {"cos": 0.5})


def test_input_shapes_use_profile_opt_and_batch_within_range() -> None:
    assert input_shapes(PROFILES, IO) == {"input": (2, 16)}
    assert input_shapes(PROFILES, IO, batch=8) == {"input": (8, 16)}
    with pytest.raises(TestInputError, match="outside"):
        input_shapes(PROFILES, IO, batch=9)
    ints = (
        TensorIO("input_ids", "input", "int64", ("b", "s")),
        TensorIO("attention_mask", "input", "int64", ("b", "s")),
    )
    feeds = random_inputs(ints, {"input_ids": (1, 4), "attention_mask": (1, 4)})
    assert feeds["attention_mask"].tolist() == [[1, 1, 1, 1]]
    assert feeds["input_ids"].dtype == np.int64 and feeds["input_ids"].max() < 100


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("engines")
    onnx_path = make_mlp(folder / "mlp.onnx")
    profile = resolve_profile(inspect_model(onnx_path).inputs, {})
    spec = BuildSpec(onnx_path, ("x86_64",), profile)
    ORT_BACKEND.build(spec, folder / "mlp.ort")
    RTX_BACKEND.build(BuildSpec(onnx_path, ("sm86",), profile), folder / "mlp.plan")
    other = make_mlp(folder / "other.onnx", seed=7)
    return {"onnx": onnx_path, "ort": folder / "mlp.ort", "plan": folder / "mlp.plan", "other": other}


def _spec(engine: Path, source: Path, **kwargs: Any) -> TestLoadSpec:
    digest = hash_file(engine)
    return TestLoadSpec(engine, digest.sha256, source, IO, PROFILES, "fp32", blake3=digest.blake3, **kwargs)


def test_ort_engine_test_loads_with_timed_phases_latency_and_accuracy(engines: dict[str, Path]) -> None:
    result = validate_engine(ORT_BACKEND, _spec(engines["ort"], engines["onnx"], iterations=20, batch=4))
    assert result.verdict == PASS, result.reason
    assert list(result.phases) == ["read_verify", "validity", "deserialize", "first_inference"]
    assert all(v > 0 for v in result.phases.values())
    assert result.latency is not None and result.latency.iterations == 20 and result.latency.batch == 4
    assert result.latency.p50_ms <= result.latency.p90_ms <= result.latency.p99_ms
    assert result.latency.throughput > 0
    assert result.input_shapes == {"input": [4, 16]}
    assert [a.name for a in result.accuracy] == ["output"]
    assert result.accuracy[0].max_abs < 1e-4 and result.accuracy[0].cosine > 0.99999


def test_accuracy_against_another_model_fails(engines: dict[str, Path]) -> None:
    result = validate_engine(ORT_BACKEND, _spec(engines["ort"], engines["other"], iterations=1))
    assert result.verdict == FAIL
    assert "outside fp32 tolerances" in result.reason
    assert result.accuracy[0].passed is False


def test_inputs_file_is_used_and_checked(engines: dict[str, Path], tmp_path: Path) -> None:
    npz = tmp_path / "in.npz"
    np.savez(npz, input=np.ones((3, 16), np.float32))
    result = validate_engine(ORT_BACKEND, _spec(engines["ort"], engines["onnx"], iterations=2, inputs_path=npz))
    assert result.verdict == PASS and result.input_shapes == {"input": [3, 16]}
    bad = tmp_path / "bad.npz"
    np.savez(bad, wrong=np.ones((3, 16), np.float32))
    with pytest.raises(TestInputError, match="lacks input"):
        validate_engine(ORT_BACKEND, _spec(engines["ort"], engines["onnx"], inputs_path=bad))


def test_corrupt_blob_is_refused_before_loading(engines: dict[str, Path], tmp_path: Path) -> None:
    digest = hash_file(engines["ort"])
    damaged = tmp_path / "damaged.ort"
    shutil.copyfile(engines["ort"], damaged)
    corrupt_blob(damaged)
    spec = TestLoadSpec(damaged, digest.sha256, engines["onnx"], IO, PROFILES, "fp32", blake3=digest.blake3)
    result = validate_engine(ORT_BACKEND, spec)
    assert result.verdict == CORRUPT and "blake3" in result.reason
    assert list(result.phases) == ["read_verify"]
    sha_only = TestLoadSpec(damaged, digest.sha256, engines["onnx"], IO, PROFILES, "fp32")
    assert "sha256" in validate_engine(ORT_BACKEND, sha_only).reason


@pytest.mark.usefixtures("requires_no_gpu")
def test_rtx_engine_is_incompatible_here_with_the_library_diagnostic(engines: dict[str, Path]) -> None:
    """Real get_engine_validity on a host without a GPU: (INVALID, 0) plus TensorRT-RTX's own log line."""
    result = validate_engine(RTX_BACKEND, _spec(engines["plan"], engines["onnx"]))
    assert result.verdict == INCOMPATIBLE
    assert result.details["validity"] == "INVALID"
    assert result.details["diagnostics_mask"] == 0
    assert any("CUDA" in line for line in result.details["library_log"]), result.details
    assert "TensorRT-RTX" in result.reason
    assert "deserialize" not in result.phases and "validity" in result.phases


def _deserialize_log(plan: Path, tmp_path: Path) -> list[str]:
    """TensorRT-RTX's own `deserialize_cuda_engine` handed the leased, verified read-only mapping of
    `plan` (what a serving load hands it, `core.verifiedread.map_file`); what the library logged."""
    from enginecache.core.backends.trt.trtlog import captured

    trt = RTX_BACKEND._trt()
    copy = tmp_path / f"leased-{plan.name}"  # a file of our own: a lease is granted to the owner alone
    shutil.copyfile(plan, copy)
    with leased_mapping(copy, blake3_digest=hash_file(copy).blake3) as view:
        with captured(trt) as (trt_logger, sink):
            engine = trt.Runtime(trt_logger).deserialize_cuda_engine(view)
        assert engine is None, "an engine deserialized on a host without a GPU"
        return list(sink)


@pytest.mark.usefixtures("requires_no_gpu")
def test_tensorrt_rtx_deserializes_from_the_leased_read_only_mapping(engines: dict[str, Path], tmp_path: Path) -> None:
    """The real library takes the mapping and reads the engine from it: a real plan gets past its
    serialization checks to the CUDA stream this host lacks, a mapping of zeros of the same size does
    not (so the library did read the mapped bytes)."""
    real = _deserialize_log(engines["plan"], tmp_path)
    assert any("cudaError" in line for line in real) and not any("Serialization" in line for line in real), real
    zeros = tmp_path / "zeros.plan"
    zeros.write_bytes(bytes(engines["plan"].stat().st_size))
    assert any("magicTag" in line for line in _deserialize_log(zeros, tmp_path)), "it never read the bytes"


def test_ort_engine_from_another_ort_version_is_incompatible(engines: dict[str, Path]) -> None:
    spec = _spec(engines["ort"], engines["onnx"], backend_version="0.1.0")
    result = validate_engine(ORT_BACKEND, spec)
    assert result.verdict == INCOMPATIBLE and "0.1.0" in result.reason


def test_trt_session_drives_the_tensorrt10_api_fake_gpu_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU here: a minimal fake of TensorRT's runtime and of core.cuda checks that the session uses
    set_input_shape (opt shape), one device buffer per tensor, set_tensor_address and execute_async_v3."""
    calls: list[tuple[Any, ...]] = []

    class FakeContext:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[int, ...]] = {"input": (-1, 16), "output": (-1, 32)}

        def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
            calls.append(("set_input_shape", name, tuple(shape)))
            self.shapes[name] = tuple(shape)
            self.shapes["output"] = (shape[0], 32)
            return True

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return self.shapes[name]

        def set_tensor_address(self, name: str, ptr: int) -> None:
            calls.append(("set_tensor_address", name, ptr))

        def execute_async_v3(self, stream: int) -> bool:
            calls.append(("execute_async_v3", stream))
            return True

    class FakeEngine:
        num_io_tensors = 2

        def get_tensor_name(self, i: int) -> str:
            return ["input", "output"][i]

        def get_tensor_mode(self, name: str) -> str:
            return "IN" if name == "input" else "OUT"

        def get_tensor_dtype(self, name: str) -> Any:
            return types.SimpleNamespace(name="FLOAT")

        def create_execution_context(self) -> FakeContext:
            return FakeContext()

    class FakeRuntime:
        def deserialize_cuda_engine(self, buffer: Any) -> FakeEngine:
            calls.append(("deserialize", len(buffer)))
            return FakeEngine()

    class FakeBuffer:
        count = 0

        def __init__(self, nbytes: int) -> None:
            FakeBuffer.count += 1
            self.nbytes, self.ptr = nbytes, 1000 * FakeBuffer.count

        def copy_from_host(self, host: Any, stream: Any) -> None:
            calls.append(("htod", host.nbytes))

        def copy_to_host(self, host: Any, stream: Any) -> None:
            host.fill(1.0)

        def free(self) -> None:
            calls.append(("free", self.ptr))

    class FakeStream:
        handle = 7

        def synchronize(self) -> None: ...

        def close(self) -> None: ...

    monkeypatch.setattr(core_cuda, "DeviceBuffer", FakeBuffer)
    monkeypatch.setattr(core_cuda, "Stream", FakeStream)
    trt = types.SimpleNamespace(TensorIOMode=types.SimpleNamespace(INPUT="IN"))
    timer = PhaseTimer()
    session = TensorRTEngineSession(
        trt, FakeRuntime(), bytearray(10), LoadSpec(input_shapes={"input": (2, 16)}), timer, [], "rtx"
    )
    assert [t.shape for t in session.io] == [(2, 16), (2, 32)]
    assert list(timer.phases) == ["deserialize", "create_context", "allocate_io"]
    out = session.infer({"input": np.zeros((2, 16), np.float32)})
    assert out["output"].shape == (2, 32) and float(out["output"].sum()) == 64.0
    assert ("set_input_shape", "input", (2, 16)) in calls
    assert [c[0] for c in calls].count("set_tensor_address") == 2
    assert ("execute_async_v3", 7) in calls
    session.close()
    assert [c[0] for c in calls].count("free") == 2
