"""Advice checked against what the backends can do (issue 28, finding 7): for an already-quantized
model the refusal of fp16 said "build it as is with precision fp32", and the TensorRT-RTX fp32 build
then failed. TensorRT's parser reads only Q/DQ of signed symmetric types (what ModelOpt writes), so a
TensorRT-RTX plan of a model quantized otherwise (ONNX Runtime's QOperator, integer ops, int32-bias
or asymmetric Q/DQ, Cast/Mul int8 weights) is refused when planned, naming why and ONNX Runtime,
which builds it; where the advice is given, following it builds. The rule is held to the real
TensorRT-RTX parser on each kind (`test_the_rule_is_the_parsers_answer`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.core.onnx_quantized import tensorrt_unreadable_file
from enginecache.errors import PrecisionError
from enginecache.service.builds import quantizedsource
from enginecache.service.builds.plan import BuildRequest, build_engine, plan_build
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.dashboardkit import Seeded, frame, view
from tests.modelfactory import make_conv, make_int8_cast_mul, quantize_with_ort

KINDS = ("qdq", "qoperator", "dynamic", "weights", "symmetric")


def _quantized(kind: str, folder: Path) -> Path:
    source = make_conv(folder / "conv.onnx")
    if kind == "weights":
        return make_int8_cast_mul(folder / "w8.onnx")
    if kind == "symmetric":
        # Q/DQ as TensorRT reads it: int8, symmetric, float bias
        return quantize_with_ort(source, folder / "conv_sym.onnx", symmetric=True, quantize_bias=False)
    return quantize_with_ort(source, folder / f"conv_{kind}.onnx", mode=kind)


@pytest.mark.parametrize("kind", ["qdq", "qoperator", "dynamic", "weights"])
def test_tensorrt_plans_of_a_model_it_cannot_read_are_refused_naming_onnx_runtime(
    app_ctx: AppContext, tmp_path: Path, kind: str
) -> None:
    register_model(app_ctx, _quantized(kind, tmp_path), name="q")
    for precision in ("fp32", "fp16", "int8"):
        with pytest.raises(PrecisionError) as caught:
            plan_build(app_ctx, BuildRequest(model="q", backend="rtx", targets=("sm89",), precision=precision))
        message = str(caught.value)
        assert "TensorRT-RTX cannot build this already-quantized model as is" in message
        assert "build it as is at fp32 with ONNX Runtime (backend ort)" in message
        assert "build it as is with precision fp32" not in message, "no advice that leads into a failure"
    assert plan_build(app_ctx, BuildRequest(model="q", backend="ort", precision="fp32")).cache_key


def test_why_names_what_tensorrt_does_not_read(tmp_path: Path) -> None:
    assert "1 Q/DQ node of INT32" in str(tensorrt_unreadable_file(_quantized("qdq", tmp_path)))
    assert "non-zero zero point" in str(tensorrt_unreadable_file(_quantized("qdq", tmp_path)))
    assert "QOperator ops" in str(tensorrt_unreadable_file(_quantized("qoperator", tmp_path)))
    assert "integer ops" in str(tensorrt_unreadable_file(_quantized("dynamic", tmp_path)))
    assert "Cast/Mul" in str(tensorrt_unreadable_file(_quantized("weights", tmp_path)))
    assert tensorrt_unreadable_file(_quantized("symmetric", tmp_path)) is None
    assert tensorrt_unreadable_file(make_conv(tmp_path / "float.onnx")) is None


def test_where_the_advice_is_given_following_it_builds(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, _quantized("symmetric", tmp_path), name="q")
    with pytest.raises(PrecisionError, match="build it as is with precision fp32") as caught:
        plan_build(app_ctx, BuildRequest(model="q", backend="rtx", targets=("sm89",), precision="fp16"))
    assert "cannot build" not in str(caught.value)
    built = build_engine(app_ctx, BuildRequest(model="q", backend="rtx", targets=("sm89",), precision="fp32"))
    assert built.engine.status == "READY", built.engine.error


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_the_rule_is_the_parsers_answer(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """Each kind built by TensorRT-RTX with the check switched off: it builds exactly where the rule
    says TensorRT reads it."""
    path = _quantized(kind, tmp_path)
    readable = tensorrt_unreadable_file(path) is None
    monkeypatch.setattr("enginecache.service.builds.plan.refuse_unbuildable_quantized", lambda *_: None)
    register_model(app_ctx, path, name="q")
    try:
        built = build_engine(app_ctx, BuildRequest(model="q", backend="rtx", targets=("sm89",), precision="fp32"))
        ok = built.engine.status == "READY"
    except Exception:  # noqa: BLE001 - the parser's refusal is the answer compared
        ok = False
    assert ok == readable, (kind, tensorrt_unreadable_file(path))


def test_the_build_matrix_shows_the_refusal_not_a_new_build(seeded: Seeded, tmp_path: Path) -> None:
    model = register_model(seeded.app, _quantized("dynamic", tmp_path), name="whisper_q").model
    at = view("build").run()
    at.selectbox(key="build_model").set_value(model.id).run()
    ort = next(o for o in at.multiselect(key="build_targets").options if o.startswith("ONNX Runtime"))
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm89", ort]).run()
    at.multiselect(key=f"build_precisions_{model.id}").set_value(["fp32"]).run()
    assert not at.exception, at.exception
    matrix = frame(at, "target", "fp32").set_index("target")
    assert "TensorRT-RTX cannot build this already-quantized model as is" in matrix.loc["TensorRT-RTX sm89", "fp32"]
    assert matrix.loc[ort, "fp32"] == "new build"
    assert at.button(key="build_submit").label == "Submit 1 build(s)"


def test_planning_a_float_model_reads_no_file(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="f")
    monkeypatch.setattr(quantizedsource, "tensorrt_unreadable_file", lambda _p: pytest.fail("read a float model"))
    plan_build(app_ctx, BuildRequest(model="f", backend="rtx", targets=("sm89",), precision="fp32"))
