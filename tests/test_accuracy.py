"""core.accuracy: verdicts a reviewer can trust. Class scores mixed with box coordinates are judged
on their own scale, with cosine and top-1/top-5 agreement, so "1 - p" and zeroed scores fail at the
int8 and fp16 tolerances while a faithful engine passes; the reference runs unoptimized."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from enginecache.core.accuracy import (
    REFERENCE_PATH,
    Part,
    compare_output,
    reference_outputs,
    reference_session_options,
    split_parts,
    tolerances_for,
)
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.lazyimport import import_backend
from enginecache.core.validate import FAIL, PASS, TestLoadSpec, validate_engine
from enginecache.errors import TestInputError
from tests.modelfactory import make_mlp

ROWS, CLASSES = 300, 20


def detector_output(layout: str = "rows") -> np.ndarray:
    """[1, ROWS, 4 + CLASSES]: boxes (cx, cy, w, h in pixels, ~230) then softmax class probabilities;
    layout "channels" is YOLO's channel-first [1, 4 + CLASSES, ROWS]."""
    rng = np.random.default_rng(0)
    centers = rng.uniform(0, 460, (ROWS, 2))
    sizes = rng.uniform(10, 300, (ROWS, 2))
    logits = rng.standard_normal((ROWS, CLASSES)) * 2.5
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    out = np.concatenate([centers, sizes, probs], axis=1)[None].astype(np.float32)
    return out if layout == "rows" else np.ascontiguousarray(out.transpose(0, 2, 1))


def _scores(out: np.ndarray, layout: str) -> np.ndarray:
    return out[..., 4:] if layout == "rows" else out[:, 4:, :]


def faithful(ref: np.ndarray, precision: str, layout: str) -> np.ndarray:
    """What a correct engine returns: the reference plus that precision's error (int8: a share of each
    branch's range; fp16: fp16 rounding of every value plus a little accumulated error)."""
    rng = np.random.default_rng(1)
    out = ref.astype(np.float64)
    if precision == "int8":
        out = out + rng.normal(0.0, 460 / 255, out.shape)
        scores = _scores(ref, layout).astype(np.float64)
        _scores(out, layout)[...] = np.clip(scores + rng.normal(0.0, 1 / 255, scores.shape), 0, 1)
    else:
        out = ref.astype(np.float16).astype(np.float64) * (1 + rng.normal(0.0, 5e-4, out.shape))
    return out.astype(np.float32)


def corrupt(ref: np.ndarray, how: str, layout: str) -> np.ndarray:
    out = ref.copy()
    scores = _scores(out, layout)
    scores[...] = 1.0 - scores if how == "one_minus_p" else 0.0
    return out


@pytest.mark.parametrize("layout", ["rows", "channels"])
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_class_score_corruptions_fail_and_a_faithful_detector_passes(precision: str, layout: str) -> None:
    ref = detector_output(layout)
    tolerances = tolerances_for(precision)
    good = compare_output("dets", faithful(ref, precision, layout), ref, tolerances)
    assert good.passed, good.failed_checks
    assert [p.role for p in good.parts] == ["values", "scores"]
    assert good.top1 is not None and good.top1 >= 0.99 and good.top5 is not None and good.top5 >= 0.99

    for how in ("one_minus_p", "zeroed"):
        bad_out = corrupt(ref, how, layout)
        # What the issue saw: over the whole output the boxes drown the scores.
        a, r = bad_out.astype(np.float64).ravel(), ref.astype(np.float64).ravel()
        assert np.dot(a, r) / (np.linalg.norm(a) * np.linalg.norm(r)) > 0.999
        old_scale = max(1.0, float(np.abs(r).max()))
        if precision == "int8" or how == "zeroed":  # the old global-scale check passed these
            assert (np.abs(a - r) <= tolerances.atol * old_scale + tolerances.rtol * np.abs(r)).all()

        bad = compare_output("dets", bad_out, ref, tolerances)
        assert not bad.passed, (precision, layout, how)
        scores = bad.parts[1]
        assert scores.role == "scores" and scores.scale_max == 1.0, "scores judged on their own range"
        assert scores.cosine < 0.9 and scores.top1 is not None and scores.top1 < 0.5
        assert any("cosine" in c for c in bad.failed_checks)
        assert any("top-1 agreement" in c for c in bad.failed_checks)
        assert bad.parts[0].failing_elements == 0, "the boxes are fine"
        assert bad.parts[0].scale_min > 100, "box channels keep their own scale"


def test_per_channel_scale_keeps_small_range_channels_from_drowning() -> None:
    """No [0, 1] block to split off: boxes ~230 beside unbounded logits; each channel has its own scale."""
    rng = np.random.default_rng(2)
    ref = np.concatenate([rng.uniform(0, 460, (64, 4)), rng.standard_normal((64, 6))], axis=1).astype(np.float32)
    assert split_parts("head", ref) == [Part("values")]
    shifted = ref.copy()
    shifted[:, 4:] += 2.0  # every logit off by 2: within 0.25 * 460 of the old rule, not within 0.25 * ~3
    result = compare_output("head", shifted, ref, tolerances_for("int8"))
    assert not result.passed and result.failing_elements == 64 * 6
    assert result.scale > 400 and result.scale_min < 5
    assert compare_output("head", ref + 0.1, ref, tolerances_for("int8")).passed


def test_top1_counts_ties_as_agreement_and_a_real_swap_as_disagreement() -> None:
    ref = np.array([[0.5, 0.499, 0.1, 0.0, -0.2, -0.3, 0.05]], np.float32)
    fp32 = tolerances_for("fp32")  # allowed at 0.5: 1e-4 + 1e-3 * 0.5 = 6e-4
    swapped = ref.copy()
    swapped[0, 0], swapped[0, 1] = 0.5 - 0.00055, 0.499 + 0.00055  # each within 6e-4, order flipped
    result = compare_output("logits", swapped, ref, fp32)
    assert result.failing_elements == 0, "every element is within tolerance ..."
    assert result.parts[0].role == "logits" and result.top1 == 0.0, "... but the best class changed"
    assert not result.passed and "top-1 agreement 0.0000 < 0.99" in result.failed_checks[0]

    tie = np.array([[0.5, 0.49995, 0.1, 0.0, -0.2, -0.3, 0.05]], np.float32)
    flipped = tie.copy()
    flipped[0, 0], flipped[0, 1] = tie[0, 1], tie[0, 0]
    assert compare_output("logits", flipped, tie, fp32).passed, "a tie within tolerance is agreement"
    assert compare_output("embeddings", swapped, ref, fp32).parts[0].top1 is None, "not named as scores"


def test_split_rules() -> None:
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4, 10))
    softmax = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    assert split_parts("output", softmax) == [Part("scores", 1, 0, 10)]
    assert split_parts("output", logits) == [Part("values")]
    assert split_parts("class_logits", logits) == [Part("logits", 1, 0, 10)]
    sigmoid = 1 / (1 + np.exp(-logits))
    assert split_parts("output", sigmoid) == [Part("values")], "[0, 1] but not summing to 1, not named"
    assert split_parts("scores", sigmoid) == [Part("scores", 1, 0, 10)]
    assert split_parts("dets", detector_output()) == [Part("values", 2, 0, 4), Part("scores", 2, 4, 24)]
    few = detector_output()[:, :5]  # 5 rows: too few to tell a block of scores from chance
    assert split_parts("dets", few) == [Part("values")]
    hidden = rng.standard_normal((1, 16, 32)).astype(np.float32)
    assert split_parts("last_hidden_state", hidden) == [Part("values")]
    assert split_parts("ids", np.arange(10).reshape(2, 5)) == [Part("values")], "integers are one part"


def test_per_output_tolerances_and_unknown_names() -> None:
    tolerances = tolerances_for("fp16", {"atol:boxes": 5.0, "min_cosine": 0.9})
    assert tolerances.min_cosine == 0.9 and tolerances.for_output("boxes").atol == 5.0
    assert tolerances.for_output("scores").atol == 1e-2
    assert tolerances.to_dict()["per_output"] == {"boxes": {"atol": 5.0}}
    for bad in ("cos", "atol:", "atol2:x"):
        with pytest.raises(TestInputError, match="unknown tolerance"):
            tolerances_for("fp16", {bad: 1.0})


def test_reference_runs_unoptimized(tmp_path: Path) -> None:
    """An ORT engine is ONNX Runtime's optimized graph; its reference is the same model with every
    graph optimization disabled, so a broken optimization does not agree with itself."""
    ort = import_backend("onnxruntime")
    options = reference_session_options(ort)
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    feeds = {"input": np.ones((2, 16), np.float32)}
    assert reference_outputs(onnx_path, feeds)["output"].shape == (2, 32)
    with pytest.raises(TestInputError, match=r"could not run the reference mlp\.onnx"):
        reference_outputs(onnx_path, {"input": np.ones((2, 15), np.float32)})  # ORT's own exception class


def test_harness_records_the_reference_path_and_per_part_results(tmp_path: Path) -> None:
    from enginecache.core.backends.base import BuildSpec, TensorIO
    from enginecache.core.hashing import hash_file
    from enginecache.core.onnx_info import inspect_model
    from enginecache.core.profiles import resolve_profile

    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    profile = resolve_profile(inspect_model(onnx_path).inputs, {})
    ORT_BACKEND.build(BuildSpec(onnx_path, ("x86_64",), profile), tmp_path / "mlp.ort")
    digest = hash_file(tmp_path / "mlp.ort")
    io = (TensorIO("input", "input", "float32", ("batch", 16)), TensorIO("output", "output", "float32", ("batch", 32)))
    profiles = {"input": {"min": [1, 16], "opt": [2, 16], "max": [8, 16]}}
    spec = TestLoadSpec(tmp_path / "mlp.ort", digest.sha256, onnx_path, io, profiles, "fp32", iterations=1)
    result = validate_engine(ORT_BACKEND, spec)
    assert result.verdict == PASS, result.reason
    assert result.details["reference"] == REFERENCE_PATH
    assert result.inputs == {"input": "N(0, 1) (float input)"}
    data = result.to_dict()["accuracy"][0]
    assert data["failing_fraction"] == 0.0 and data["parts"][0]["role"] == "values"
    other = make_mlp(tmp_path / "other.onnx", seed=7)
    failed = validate_engine(ORT_BACKEND, TestLoadSpec(spec.engine_path, spec.sha256, other, io, profiles, "fp32"))
    assert failed.verdict == FAIL and "output: " in failed.reason and "elements" in failed.reason
