"""Precisions the installed tools cannot make are not offered, with the reason (issue 28, finding 8:
bf16, and int8/fp8 for TensorRT, were offered without the modelopt extra; the matrix said "new build"
and both jobs failed). Without ModelOpt (`no_modelopt`: the default install), the Build form omits
bf16 everywhere and int8/fp8 where every chosen target is a TensorRT one, naming the extra; a bf16
build is refused when planned (exit 2 from the CLI), never queued. With ModelOpt, all are offered."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.errors import PrecisionError
from enginecache.service.builds.plan import BuildRequest, plan_build
from enginecache.service.builds.precisionchoices import precision_choices
from enginecache.service.builds.submit import submit_build
from tests.clirunner import run_cli
from tests.dashboardkit import Seeded, frame, plain, queued_jobs, view

RTX = "TensorRT-RTX sm89"


def _build_view(seeded: Seeded, targets: list[str]) -> tuple[AppTest, list[str]]:
    at = view("build").run()
    at.multiselect(key="build_targets").set_value(targets).run()
    assert not at.exception, at.exception
    return at, list(at.multiselect(key=f"build_precisions_{seeded.model_id}").options)


def _ort_label(at: AppTest) -> str:
    return next(o for o in at.multiselect(key="build_targets").options if o.startswith("ONNX Runtime"))


def _captions(at: AppTest) -> str:
    return "\n".join(plain(c.value) for c in at.caption)


@pytest.mark.usefixtures("no_modelopt")
def test_without_modelopt_bf16_int8_fp8_are_not_offered_for_tensorrt_with_the_reason(seeded: Seeded) -> None:
    at, offered = _build_view(seeded, [RTX])
    assert offered == ["fp32", "fp16"]
    captions = _captions(at)
    assert "Not offered: bf16 needs NVIDIA ModelOpt AutoCast: pip install 'enginecache[modelopt]'" in captions
    assert "int8 for a TensorRT backend quantizes with NVIDIA ModelOpt's ONNX PTQ" in captions
    assert "fp8 for a TensorRT backend" in captions


@pytest.mark.usefixtures("no_modelopt")
def test_int8_stays_offered_for_onnx_runtime_and_its_tensorrt_cell_says_why(seeded: Seeded) -> None:
    at = view("build").run()
    at, offered = _build_view(seeded, [RTX, _ort_label(at)])
    assert "int8" in offered and "bf16" not in offered
    at.multiselect(key=f"build_precisions_{seeded.model_id}").set_value(["int8"]).run()
    matrix = frame(at, "target", "int8").set_index("target")
    assert "quantizes with NVIDIA ModelOpt's ONNX PTQ" in matrix.loc[RTX, "int8"], "not 'new build', not calibration"
    assert at.button(key="build_submit").disabled


def test_with_modelopt_every_precision_is_offered(seeded: Seeded) -> None:
    pytest.importorskip("modelopt", reason="the modelopt extra is not installed here")
    at, offered = _build_view(seeded, [RTX])
    assert offered == ["fp32", "fp16", "bf16", "int8", "fp8"]
    assert "Not offered" not in _captions(at)


@pytest.mark.usefixtures("no_modelopt")
def test_a_bf16_build_without_modelopt_is_refused_when_planned_not_in_its_job(
    seeded: Seeded, capsys: pytest.CaptureFixture[str]
) -> None:
    for backend in ("ort", "rtx"):
        request = BuildRequest(model="convnet", backend=backend, precision="bf16")
        with pytest.raises(PrecisionError, match=r"bf16 needs NVIDIA ModelOpt AutoCast"):
            plan_build(seeded.app, request)
        with pytest.raises(PrecisionError):
            submit_build(seeded.app, request)
    result = run_cli(
        capsys, "--home", str(seeded.app.home), "build", "convnet", "--backend", "ort", "--precision", "bf16", "--queue"
    )
    assert result.code == 2 and "bf16 needs NVIDIA ModelOpt AutoCast" in result.err, result.err
    assert queued_jobs(seeded.app) == []


@pytest.mark.usefixtures("no_modelopt")
def test_the_choices_follow_the_backends_asked_for() -> None:
    reasons = {c.precision: c.reason for c in precision_choices(["ort"])}
    assert reasons["int8"] is None and reasons["fp16"] is None and reasons["bf16"] is not None
    reasons = {c.precision: c.reason for c in precision_choices(["rtx"])}
    assert reasons["int8"] is not None and reasons["fp32"] is None
