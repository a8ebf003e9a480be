"""The Llama-like decoder (tests/llamamodel.py, the suite's tiny variant) built for real on
TensorRT-RTX (fp16) and ONNX Runtime, and its ORT engine test-loaded with token inputs: ids bounded
by the vocabulary, position ids, and a past that is empty (the first step) or not."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from enginecache.core.precision.native import computes_in
from enginecache.db.models import EngineStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.models.register import get_model, model_path, register_model
from tests.llamamodel import PRESETS, LlamaConfig, parameter_count, write_llama

CONFIG = PRESETS["tiny"]


@pytest.fixture(scope="module")
def llama_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_llama(tmp_path_factory.mktemp("llama") / "llama.onnx", "tiny", "fp32")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory, llama_path: Path) -> Iterator[AppContext]:
    ctx = AppContext.from_settings(tmp_path_factory.mktemp("llama-home") / "home")
    try:
        register_model(ctx, llama_path, name="llama")
        yield ctx
    finally:
        ctx.close()


def _feeds(config: LlamaConfig, *, batch: int, seq: int, past: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {
        "input_ids": rng.integers(0, config.vocab, (batch, seq), dtype=np.int64),
        "position_ids": np.tile(np.arange(past, past + seq, dtype=np.int64), (batch, 1)),
    }
    for layer in range(config.layers):
        for kind in ("key", "value"):
            shape = (batch, config.kv_heads, past, config.head_dim)
            feeds[f"past_key_values.{layer}.{kind}"] = rng.standard_normal(shape, dtype=np.float32)
    return feeds


def test_the_model_is_a_decoder_whose_cache_gives_what_a_full_pass_gives(llama_path: Path) -> None:
    """The graph is a real causal decoder: logits of a step after a cached prefix equal the logits a
    full pass gives at those positions, and the prefix's logits do not see later tokens."""
    session = ort.InferenceSession(str(llama_path))
    full = _feeds(CONFIG, batch=2, seq=9, past=0)
    everything = session.run(None, full)
    prefix = {**full, "input_ids": full["input_ids"][:, :5], "position_ids": full["position_ids"][:, :5]}
    first = session.run(None, prefix)
    names = [o.name for o in session.get_outputs()]
    step = {"input_ids": full["input_ids"][:, 5:], "position_ids": full["position_ids"][:, 5:]}
    for layer in range(CONFIG.layers):
        for kind in ("key", "value"):
            step[f"past_key_values.{layer}.{kind}"] = first[names.index(f"present.{layer}.{kind}")]
    second = session.run(None, step)
    np.testing.assert_allclose(second[0], everything[0][:, 5:], atol=1e-4)
    np.testing.assert_allclose(first[0], everything[0][:, :5], atol=1e-4)
    assert second[names.index("present.0.key")].shape == (2, CONFIG.kv_heads, 9, CONFIG.head_dim)


def test_parameter_count_is_what_the_file_holds(llama_path: Path) -> None:
    model = onnx.load(str(llama_path))
    weights = sum(
        int(np.prod(t.dims)) for t in model.graph.initializer if t.data_type != onnx.TensorProto.INT64 and t.dims
    )
    tables = 2 * CONFIG.max_positions * CONFIG.head_dim  # rope_cos, rope_sin: not parameters
    assert parameter_count(CONFIG) == weights - tables
    assert 0.9e9 < parameter_count(PRESETS["1b"]) < 1.1e9


def test_rtx_fp16_engine_builds_ready(app: AppContext) -> None:
    result = build_engine(
        app, BuildRequest(model="llama", backend="rtx", targets=("sm89",), precision="fp16", converter="onnxconverter")
    )
    engine = result.engine
    assert engine.status == EngineStatus.READY, engine.error
    assert engine.precision == "fp16" and engine.size_bytes
    inputs = [t["name"] for t in engine.io if t["mode"] == "input"]
    outputs = [t["name"] for t in engine.io if t["mode"] == "output"]
    assert inputs[:2] == ["input_ids", "position_ids"] and "past_key_values.1.value" in inputs
    assert outputs[0] == "logits" and "present.1.value" in outputs


def test_a_model_already_in_fp16_builds_at_fp16_without_a_conversion(app: AppContext, tmp_path: Path) -> None:
    """Weights and activations exported in fp16: an fp16 build takes the graph as exported (no
    converter runs, no variant is stored) and says so."""
    half = write_llama(tmp_path / "half" / "llama16.onnx", "tiny", "fp16")
    assert computes_in(half, "fp16") and not computes_in(half, "bf16")
    assert not computes_in(model_path(app, get_model(app, "llama")), "fp16")
    register_model(app, half, name="llama16")
    result = build_engine(app, BuildRequest(model="llama16", backend="rtx", targets=("sm89",), precision="fp16"))
    engine = result.engine
    assert engine.status == EngineStatus.READY, engine.error
    assert engine.precision == "fp16" and engine.variant_model_id is None
    assert any("already computes in fp16" in w for w in engine.warnings), engine.warnings


@pytest.fixture(scope="module")
def ort_engine_id(app: AppContext) -> int:
    result = build_engine(app, BuildRequest(model="llama", backend="ort"))
    assert result.engine.status == EngineStatus.READY, result.engine.error
    return int(result.engine.id or 0)


def test_ort_engine_test_loads_with_generated_token_inputs(app: AppContext, ort_engine_id: int) -> None:
    run = run_test_load(app, ort_engine_id, iterations=2)
    assert run.verdict == "PASS", run.reason
    described = run.details["inputs"]
    assert described["input_ids"].startswith(f"integers in [0, {CONFIG.vocab})"), described
    assert "position ids" in described["position_ids"], described


@pytest.mark.parametrize("past", [0, 6], ids=["empty-past", "with-past"])
def test_ort_engine_test_loads_a_decode_step(app: AppContext, ort_engine_id: int, tmp_path: Path, past: int) -> None:
    inputs = tmp_path / "step.npz"
    np.savez(inputs, **_feeds(CONFIG, batch=1, seq=3, past=past))
    run = run_test_load(app, ort_engine_id, iterations=2, inputs=inputs)
    assert run.verdict == "PASS", run.reason
    assert run.input_shapes["past_key_values.0.key"] == [1, CONFIG.kv_heads, past, CONFIG.head_dim]
    assert {a["name"]: a["shape"] for a in run.accuracy}["present.0.key"] == [
        1,
        CONFIG.kv_heads,
        past + 3,
        CONFIG.head_dim,
    ]
