"""The four reference models built for real: rtx fp32/fp16 (AutoCast for tiny_llama), bf16, int8, ort."""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from enginecache.db.models import EngineStatus
from enginecache.service.builds.plan import BuildRequest, BuildResult, build_engine
from enginecache.service.context import AppContext
from tests.conftest import reference_catalog

pytestmark = pytest.mark.shared  # every test here builds ../shared/models

# The reference models (tests/conftest.py's REFERENCE_MODELS): their input and output names.
MODELS = {
    "resnet18": (["input"], ["logits"]),
    "mobilenet_v3_small": (["input"], ["logits"]),
    "bert_mini": (["input_ids", "attention_mask"], ["last_hidden_state"]),
    "tiny_llama": (["input_ids", "attention_mask"], ["logits"]),
}


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppContext]:
    yield from reference_catalog(tmp_path_factory.mktemp("shared"))


def _check_engine(app: AppContext, result: BuildResult, name: str, precision: str) -> None:
    inputs, outputs = MODELS[name]
    engine = result.engine
    assert engine.status == EngineStatus.READY, engine.error
    assert engine.precision == precision
    blob = app.home / (engine.blob_path or "")
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == engine.sha256
    assert engine.size_bytes == blob.stat().st_size
    assert [t["name"] for t in engine.io if t["mode"] == "input"] == inputs
    assert [t["name"] for t in engine.io if t["mode"] == "output"] == outputs
    assert engine.key_ingredients["onnx_digest"] == result.model.digest
    assert engine.key_ingredients["precision"]["name"] == precision


@pytest.mark.parametrize("name", sorted(MODELS))
def test_rtx_fp32_and_fp16(app: AppContext, name: str) -> None:
    fp32 = build_engine(app, BuildRequest(model=name, backend="rtx", targets=("sm86",)))
    _check_engine(app, fp32, name, "fp32")
    fp16 = build_engine(app, BuildRequest(model=name, backend="rtx", targets=("sm86",), precision="fp16"))
    _check_engine(app, fp16, name, "fp16")
    assert fp16.engine.precision_recipe["tool"] == "modelopt.autocast", "the modelopt extra is installed by make test"
    assert (fp16.engine.size_bytes or 0) < 0.75 * (fp32.engine.size_bytes or 0), "fp16 weights halve the engine"
    assert fp16.engine.variant_model_id is not None
    repeat = build_engine(app, BuildRequest(model=name, backend="rtx", targets=("sm86",), precision="fp16"))
    assert repeat.cache_hit is True and repeat.engine.id == fp16.engine.id


def test_onnxconverter_fp16_builds_resnet18(app: AppContext) -> None:
    result = build_engine(
        app,
        BuildRequest(model="resnet18", backend="rtx", targets=("sm89",), precision="fp16", converter="onnxconverter"),
    )
    _check_engine(app, result, "resnet18", "fp16")
    assert result.engine.precision_recipe["tool"] == "onnxconverter_common.float16"
    assert (result.engine.size_bytes or 0) < 30_000_000


def test_bf16_resnet18(app: AppContext) -> None:
    result = build_engine(app, BuildRequest(model="resnet18", backend="rtx", targets=("sm89",), precision="bf16"))
    _check_engine(app, result, "resnet18", "bf16")
    assert (result.engine.size_bytes or 0) < 30_000_000


def test_int8_mobilenet_with_calibration(app: AppContext, tmp_path: Path) -> None:
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(0).standard_normal((4, 3, 224, 224)).astype(np.float32))
    result = build_engine(
        app,
        BuildRequest(model="mobilenet_v3_small", backend="rtx", targets=("sm89",), precision="int8", calibration=calib),
    )
    _check_engine(app, result, "mobilenet_v3_small", "int8")
    recipe = result.engine.key_ingredients["precision"]
    assert recipe["calibration_digest"] == hashlib.sha256(calib.read_bytes()).hexdigest()
    assert not any("uncalibrated" in w for w in result.engine.warnings)
    other = tmp_path / "calib2.npz"
    shutil.copy(calib, other)
    np.savez(other, input=np.random.default_rng(1).standard_normal((4, 3, 224, 224)).astype(np.float32))
    different = build_engine(
        app,
        BuildRequest(model="mobilenet_v3_small", backend="rtx", targets=("sm89",), precision="int8", calibration=other),
    )
    assert different.cache_hit is False, "other calibration data is another engine"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ort_fp32(app: AppContext, name: str) -> None:
    result = build_engine(app, BuildRequest(model=name, backend="ort"))
    _check_engine(app, result, name, "fp32")
    assert result.engine.key_ingredients["target"]["cpu"] == result.engine.targets
