"""An ONNX Runtime "fp16" engine is the size of the fp32 one: ORT's CPU optimizer folds the fp16
weights' Casts back to fp32. Measured here (the engines' sizes, and the weights each stores, read
from the ORT-format flatbuffer), the build says so: a warning on the engine, in its builder log and
in `engine show`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from enginecache.core.backends.ort.weights import low_precision_warning, stored_weight_bytes
from enginecache.core.blobpaths import blob_path
from enginecache.core.onnx_info import inspect_model
from enginecache.db.models import ModelRecord
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp

STORED_AT_FP32 = "ONNX Runtime stored this fp16 engine's weights at fp32"


def test_an_ort_fp16_engine_stored_at_fp32_says_so(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = make_mlp(tmp_path / "mlp.onnx", features=256, hidden=256)
    weights = inspect_model(source).parameter_bytes  # 525,312 bytes of fp32 weights
    register_model(app_ctx, source, name="mlp")
    fp32 = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort", precision="fp32")).engine
    fp16 = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort", precision="fp16")).engine
    assert fp32.size_bytes and fp16.size_bytes and fp32.sha256 and fp16.sha256

    # The measurement: the fp16 variant holds fp16 weights, the engine ORT made of it fp32 ones.
    with app_ctx.catalog.read() as session:
        variant = session.get(ModelRecord, fp16.variant_model_id)
    assert variant is not None
    converted = onnx.load(str(app_ctx.home / variant.store_path))
    halves = [t for t in converted.graph.initializer if t.data_type == onnx.TensorProto.FLOAT16]
    assert sum(2 * int(np.prod(t.dims)) for t in halves) >= weights // 4  # AutoCast may keep a layer fp32
    stored16 = stored_weight_bytes(blob_path(app_ctx.home, fp16.sha256))
    assert stored_weight_bytes(blob_path(app_ctx.home, fp32.sha256)) == {"fp32": weights}
    assert stored16 == {"fp32": weights}
    assert 0.98 < fp16.size_bytes / fp32.size_bytes < 1.02  # not the half an fp16 engine would be

    [warning] = [w for w in fp16.warnings if STORED_AT_FP32 in w]
    assert f"measured: {weights:,} bytes of fp32 weights, 0 of fp16" in warning
    assert f"the engine ({fp16.size_bytes:,} bytes)" in warning
    assert warning in fp16.builder_log
    assert not any(STORED_AT_FP32 in w for w in fp32.warnings)
    assert low_precision_warning(blob_path(app_ctx.home, fp32.sha256), "fp32") is None

    shown = run_cli(capsys, "--home", str(app_ctx.home), "engine", "show", str(fp16.id)).out
    assert f"warning: {warning}" in shown
