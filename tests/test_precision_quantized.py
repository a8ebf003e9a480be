"""Already-quantized models: detected at inspection (`ModelInfo.quantized`, shown by `model show`),
refused for int8/fp8 (re-quantize) and fp16/bf16 (convert) with that reason at plan time (exit 2),
built as is at fp32. The quantized models are made here with onnxruntime.quantization."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.core.onnx_info import inspect_model
from enginecache.core.precision import PrecisionSpec, convert_precision
from enginecache.errors import PrecisionError
from enginecache.service.builds.plan import BuildRequest, build_engine, plan_build
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.modelfactory import make_conv, make_int8_cast_mul, make_mlp, quantize_with_ort


@pytest.fixture
def qdq_conv(tmp_path: Path) -> Path:
    return quantize_with_ort(make_conv(tmp_path / "conv.onnx"), tmp_path / "conv_qdq.onnx", mode="qdq")


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("qdq", "Q/DQ nodes ("),
        ("qoperator", "QOperator ops (1 QLinearConv, 1 QLinearMatMul"),
        ("dynamic", "integer ops (1 ConvInteger, 2 DynamicQuantizeLinear, 1 MatMulInteger)"),
    ],
)
def test_inspection_says_how_a_model_is_quantized(tmp_path: Path, mode: str, expected: str) -> None:
    source = make_conv(tmp_path / "conv.onnx")
    assert inspect_model(source).quantized is None
    quantized = quantize_with_ort(source, tmp_path / f"conv_{mode}.onnx", mode=mode)
    info = inspect_model(quantized)
    assert info.quantized is not None and expected in info.quantized
    assert info.to_dict()["quantized"] == info.quantized


def test_int8_weights_behind_cast_and_mul_are_detected(tmp_path: Path) -> None:
    info = inspect_model(make_int8_cast_mul(tmp_path / "w8.onnx"))
    assert info.quantized == "1 INT8/UINT8 weight tensor dequantized by Cast/Mul (weight-only quantization)"


@pytest.mark.parametrize("precision", ["int8", "fp8", "fp16"])
def test_convert_refuses_an_already_quantized_model(qdq_conv: Path, tmp_path: Path, precision: str) -> None:
    with pytest.raises(PrecisionError) as caught:
        convert_precision(qdq_conv, PrecisionSpec(precision, backend_family="ort"), tmp_path / "work")
    message = str(caught.value)
    assert message.startswith("conv_qdq.onnx: the model is already quantized: Q/DQ nodes (")
    verb = "re-quantize" if precision != "fp16" else "convert"
    assert f"enginecache does not {verb} it to {precision}" in message
    assert "build it as is with precision fp32" in message
    assert not (tmp_path / "work").exists(), "refused before any work"


def test_fp32_of_an_already_quantized_model_is_the_model_itself(qdq_conv: Path, tmp_path: Path) -> None:
    result = convert_precision(qdq_conv, PrecisionSpec("fp32"), tmp_path / "work")
    assert result.path == qdq_conv and not result.converted


def test_spec_refuses_at_construction() -> None:
    with pytest.raises(PrecisionError, match=r"already quantized: Q/DQ nodes .*does not re-quantize it to int8"):
        PrecisionSpec("int8", source_quantized="Q/DQ nodes (2 QuantizeLinear)")
    assert PrecisionSpec("fp32", source_quantized="Q/DQ nodes (2 QuantizeLinear)").precision == "fp32"


def test_plan_refuses_with_the_reason_and_exit_2(
    app_ctx: AppContext, qdq_conv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = register_model(app_ctx, qdq_conv, name="qconv").model
    assert "Q/DQ nodes" in model.info["quantized"]
    shown = run_cli(capsys, "--home", str(app_ctx.home), "model", "show", "qconv", "--json").json()
    assert shown["quantized"] == model.info["quantized"]
    for precision in ("int8", "fp16"):
        with pytest.raises(PrecisionError, match="already quantized"):
            plan_build(app_ctx, BuildRequest(model="qconv", backend="ort", precision=precision))
        result = run_cli(
            capsys, "--home", str(app_ctx.home), "build", "qconv", "--backend", "ort", "--precision", precision
        )
        assert result.code == 2, result.err
        assert "the model is already quantized: Q/DQ nodes" in result.err
        assert "Traceback" not in result.err
    built = build_engine(app_ctx, BuildRequest(model="qconv", backend="ort", precision="fp32"))
    assert built.engine.status == "READY"


def test_float_model_still_converts(tmp_path: Path) -> None:
    mlp = make_mlp(tmp_path / "mlp.onnx")
    assert inspect_model(mlp).quantized is None
    result = convert_precision(mlp, PrecisionSpec("int8", backend_family="ort"), tmp_path / "work")
    assert result.converted
