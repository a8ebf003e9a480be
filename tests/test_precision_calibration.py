"""Calibration data for int8/fp8 recipes (core.calibration): loading, checking, batching, random feeds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from enginecache.core.calibration import (
    DEFAULT_DYNAMIC_DIM,
    ModelInput,
    batch_arrays,
    load_calibration,
    random_batches,
    read_model_inputs,
)
from enginecache.core.precision import PrecisionSpec, convert_precision
from enginecache.errors import CalibrationError
from tests.modelfactory import make_mlp

TOKEN_INPUTS = (
    ModelInput("input_ids", TensorProto.INT64, ("batch", "seq")),
    ModelInput("attention_mask", TensorProto.INT64, ("batch", "seq")),
    ModelInput("pixels", TensorProto.FLOAT, ("batch", 3, 8, 8)),
)


def _npz(tmp_path: Path, **arrays: np.ndarray) -> Path:
    path = tmp_path / "calib.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def _good_arrays() -> dict[str, np.ndarray]:
    return {
        "input_ids": np.zeros((5, 7), np.int32),
        "attention_mask": np.ones((5, 7), np.int64),
        "pixels": np.zeros((5, 3, 8, 8), np.float32),
    }


def test_load_calibration_casts_to_input_dtypes(tmp_path: Path) -> None:
    arrays = load_calibration(_npz(tmp_path, **_good_arrays()), TOKEN_INPUTS)
    assert arrays["input_ids"].dtype == np.int64 and arrays["pixels"].dtype == np.float32
    assert len(batch_arrays(arrays, TOKEN_INPUTS)) == 1  # dynamic batch: one feed of all samples


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ("missing", r"missing arrays for model inputs \['attention_mask'\]"),
        ("extra", r"extra arrays \['labels'\] that are not model inputs"),
        ("rank", r"array 'pixels' has rank 3 .* model input 'pixels' has rank 4"),
        ("dtype", r"array 'input_ids' has dtype float32 but model input 'input_ids' is int64"),
        ("static_dim", r"array 'pixels' has shape \[5, 3, 9, 8\]"),
        ("count", r"different sample counts"),
    ],
)
def test_load_calibration_errors_name_the_array(tmp_path: Path, change: str, pattern: str) -> None:
    arrays = _good_arrays()
    if change == "missing":
        del arrays["attention_mask"]
    elif change == "extra":
        arrays["labels"] = np.zeros(5, np.int64)
    elif change == "rank":
        arrays["pixels"] = np.zeros((3, 8, 8), np.float32)
    elif change == "dtype":
        arrays["input_ids"] = np.zeros((5, 7), np.float32)
    elif change == "static_dim":
        arrays["pixels"] = np.zeros((5, 3, 9, 8), np.float32)
    else:
        arrays["input_ids"] = np.zeros((4, 7), np.int64)
    with pytest.raises(CalibrationError, match=pattern):
        load_calibration(_npz(tmp_path, **arrays), TOKEN_INPUTS)


def test_calibration_error_through_convert(mlp: Path, tmp_path: Path) -> None:
    calib = _npz(tmp_path, inputs=np.zeros((4, 16), np.float32))
    with pytest.raises(
        CalibrationError, match=r"missing arrays for model inputs \['input'\]; extra arrays \['inputs'\]"
    ):
        convert_precision(mlp, PrecisionSpec("int8", calibration=calib), tmp_path / "work")
    assert not list((tmp_path / "work").glob("*.onnx"))


def test_calibration_file_not_npz(mlp: Path, tmp_path: Path) -> None:
    bogus = tmp_path / "calib.npz"
    bogus.write_text("hello")
    with pytest.raises(CalibrationError, match=r"not a readable \.npz"):
        convert_precision(mlp, PrecisionSpec("int8", calibration=bogus), tmp_path / "work")
    with pytest.raises(CalibrationError, match="does not exist"):
        convert_precision(mlp, PrecisionSpec("int8", calibration=tmp_path / "none.npz"), tmp_path / "work")


def test_static_batch_must_divide_samples(tmp_path: Path) -> None:
    inputs = (ModelInput("x", TensorProto.FLOAT, (4, 2)),)
    arrays = load_calibration(_npz(tmp_path, x=np.zeros((6, 2), np.float32)), inputs)
    with pytest.raises(CalibrationError, match="not a multiple of the model's static batch size 4"):
        batch_arrays(arrays, inputs)


def test_random_batches_follow_the_documented_rules() -> None:
    feeds = random_batches(TOKEN_INPUTS, {"pixels": (2, 3, 8, 8)}, batches=2)
    assert len(feeds) == 2
    feed = feeds[0]
    assert feed["input_ids"].shape == (1, DEFAULT_DYNAMIC_DIM) and feed["input_ids"].dtype == np.int64
    assert feed["input_ids"].min() >= 0 and feed["input_ids"].max() < 100
    assert (feed["attention_mask"] == 1).all()
    assert feed["pixels"].shape == (2, 3, 8, 8) and feed["pixels"].dtype == np.float32
    again = random_batches(TOKEN_INPUTS, {"pixels": (2, 3, 8, 8)}, batches=2)
    assert np.array_equal(again[1]["pixels"], feeds[1]["pixels"])  # seeded: reproducible recipe


def test_read_model_inputs_skips_initializers_listed_as_inputs(tmp_path: Path) -> None:
    path = make_mlp(tmp_path / "mlp.onnx")
    model = onnx.load(str(path))
    model.graph.input.append(helper.make_tensor_value_info("w1", TensorProto.FLOAT, [16, 32]))  # IR<4 style
    onnx.save(model, str(path))
    assert read_model_inputs(path) == (ModelInput("input", TensorProto.FLOAT, ("batch", 16)),)
