"""READY means loadable: an engine is READY only after its backend proved, on the building host,
that it loads (ONNX Runtime: a session from the stored bytes); one that does not is FAILED with the
runtime's own words, and a load that fails at serve time is EngineRejectedError, never one of
ONNX Runtime's raw exception classes.

The engine that does not load is a real one: ONNX Runtime writes an ORT-format model it then refuses
to read for the Q/DQ graph its own quantizer makes from PaddleOCR's direction classifier at opset 11
("Unrecognized attribute: axis for operator DequantizeLinear"); the product's int8 recipe moves such
a model to opset 13 first, so its int8 engine loads and passes its test-load."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sqlmodel import select

from enginecache.core.backends.base import LoadSpec
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import BuildFailedError, EngineRejectedError, LoadFailedError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.serving.runtime import load_or_build
from enginecache.service.serving.runtimetypes import RuntimeSpec
from tests.conftest import skip_or_fail
from tests.corpus import BY_NAME, corpus_path, missing

pytestmark = [pytest.mark.realmodels, pytest.mark.shared]

CLASSIFIER = "ppocr_cls"  # opset 11, weights in Constant nodes
SHAPE = (1, 3, 48, 192)


@pytest.fixture
def classifier() -> Path:
    if BY_NAME[CLASSIFIER] in missing():
        skip_or_fail(f"the corpus model {CLASSIFIER} is not fetched (make corpus)")
    return corpus_path(CLASSIFIER)


def _quantize_as_is(source: Path, target: Path) -> Path:
    """onnxruntime.quantization's Q/DQ graph at the model's own opset (what the recipe did before)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    class Batches(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = 2

        def get_next(self) -> dict[str, np.ndarray] | None:
            self.left -= 1
            return {"x": np.random.default_rng(self.left).random(SHAPE, dtype=np.float32)} if self.left >= 0 else None

    staged = target.parent / "source.onnx"
    staged.write_bytes(source.read_bytes())  # the quantizer writes beside its input
    quantize_static(str(staged), str(target), Batches(), quant_format=QuantFormat.QDQ, per_channel=False)
    return target


def _profile() -> tuple[str, ...]:
    return (f"x={'x'.join(map(str, SHAPE))}",)


def test_an_engine_the_runtime_cannot_load_is_failed_with_its_words_never_ready(
    app_ctx: AppContext, classifier: Path, tmp_path: Path
) -> None:
    qdq = _quantize_as_is(classifier, tmp_path / "cls.qdq.onnx")
    model = register_model(app_ctx, qdq, name="cls-qdq").model
    with pytest.raises(BuildFailedError) as raised:
        build_engine(app_ctx, BuildRequest(model=str(model.id), backend="ort", precision="fp32", profiles=_profile()))
    message = str(raised.value)
    assert "does not load on the building host" in message
    assert "DequantizeLinear" in message, "the runtime's own words"
    with app_ctx.catalog.read() as session:
        rows = session.exec(select(EngineRecord)).all()
    assert [r.status for r in rows] == [EngineStatus.FAILED]
    assert rows[0].error and "DequantizeLinear" in rows[0].error


def test_onnx_runtime_refusing_engine_bytes_is_a_load_failure_not_its_raw_exception(
    classifier: Path, tmp_path: Path
) -> None:
    refused = _refused_ort_file(classifier, tmp_path)
    with pytest.raises(LoadFailedError, match="INVALID_GRAPH"):
        ORT_BACKEND.load(refused.read_bytes(), LoadSpec(label="the ORT-format file"))


def _refused_ort_file(classifier: Path, folder: Path) -> Path:
    """An ORT-format file ONNX Runtime writes and then refuses to read (what older engines were)."""
    import onnxruntime as ort

    qdq = _quantize_as_is(classifier, folder / "cls.qdq.onnx")
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(folder / "cls.ort")
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(qdq), options, providers=["CPUExecutionProvider"])
    return folder / "cls.ort"


def test_a_load_the_runtime_refuses_at_serve_time_is_rejected_with_its_words_and_noted_on_the_engine(
    app_ctx: AppContext, classifier: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A READY engine whose verified bytes the runtime refuses, as an engine published before the
    build proved loads would be: load_or_build raises EngineRejectedError ERROR with ONNX Runtime's
    words (never its raw InvalidGraph), on the full path and on the hit path, and the engine's
    `error` names this host; it stays READY (another host or runtime may load it)."""
    register_model(app_ctx, classifier, name="cls")
    spec = RuntimeSpec(backend="ort", profiles=_profile())
    engine = build_engine(app_ctx, spec.request("cls")).engine
    blob = app_ctx.store.ingest_file(_refused_ort_file(classifier, tmp_path))
    with app_ctx.catalog.write() as session:
        row = session.get(EngineRecord, engine.id)
        assert row is not None
        row.sha256, row.blake3, row.size_bytes = blob.sha256, blob.blake3, blob.size
        row.header_blake3 = blob.head_blake3  # every digest the row records is the new blob's
        row.blob_path = app_ctx.store.relative(blob.path)
        session.add(row)
    for via in ("fullpath", "hitpath"):
        with pytest.raises(EngineRejectedError) as raised:
            load_or_build(classifier, spec=spec, on_miss="fail", app=app_ctx)
        assert raised.value.verdict == "ERROR", via
        assert "INVALID_GRAPH" in str(raised.value) and "DequantizeLinear" in str(raised.value), via
        with app_ctx.catalog.read() as session:
            row = session.get(EngineRecord, engine.id)
            assert row is not None
            assert row.status == EngineStatus.READY and "could not load it" in (row.error or ""), via
            assert "DequantizeLinear" in (row.error or "")
            row.error = None  # the hit path must write it again
            session.add(row)
            session.commit()

        def full_path(*_args: object, **_kwargs: object) -> None:
            raise AssertionError("the second load should take the hit path")

        monkeypatch.setattr("enginecache.service.serving.loadpath.load_engine_record", full_path)


def test_the_int8_recipe_moves_an_old_opset_model_to_13_so_its_engine_loads_and_passes(
    app_ctx: AppContext, classifier: Path
) -> None:
    model = register_model(app_ctx, classifier, name="cls").model
    built = build_engine(
        app_ctx, BuildRequest(model=str(model.id), backend="ort", precision="int8", profiles=_profile())
    )
    engine = built.engine
    assert engine.status == EngineStatus.READY
    assert "proven loadable: ONNX Runtime" in (engine.builder_log or "")
    assert any("opset 11 -> 13" in w for w in engine.warnings)
    run = run_test_load(app_ctx, engine.id or 0, iterations=1)
    assert run.verdict == "PASS", run.reason
