"""A loaded ORT engine holds the model once: the session lets go of the engine's bytes when it is made
(ORT's Python wrapper would keep them for as long as the session lives), and still runs right after
that memory is gone and reused."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

from enginecache.core.backends.loadtypes import LoadSpec
from enginecache.core.backends.ort.backend import ORT_BACKEND
from tests.modelfactory import make_mlp


def _ort_engine(folder: Path) -> tuple[Path, Path]:
    """An MLP and its ORT-format engine, as the ORT backend writes one."""
    onnx_path = make_mlp(folder / "mlp.onnx", features=256, hidden=1024)
    options = ort.SessionOptions()
    options.optimized_model_filepath = str(folder / "mlp.ort")
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return onnx_path, folder / "mlp.ort"


def test_a_loaded_session_no_longer_holds_the_engine_bytes(tmp_path: Path) -> None:
    _, engine_path = _ort_engine(tmp_path)
    engine = engine_path.read_bytes()
    held_before = sys.getrefcount(engine)
    session = ORT_BACKEND.load(engine, LoadSpec(label="mlp"))
    try:
        assert sys.getrefcount(engine) == held_before, "something still refers to the engine's bytes"
        assert session.raw._model_bytes is None, "ORT's wrapper keeps the engine's bytes"
    finally:
        session.close()


def test_the_session_runs_right_after_its_bytes_are_freed_and_overwritten(tmp_path: Path) -> None:
    onnx_path, engine_path = _ort_engine(tmp_path)
    session = ORT_BACKEND.load(engine_path.read_bytes(), LoadSpec(label="mlp"))  # the bytes die here
    try:
        gc.collect()
        scribbles = [bytes([value]) * engine_path.stat().st_size for value in (0x00, 0xFF, 0x5A)]  # reuse that memory
        feed = np.random.default_rng(1).standard_normal((4, 256)).astype(np.float32)
        reference = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).run(None, {"input": feed})
        got = session.infer({"input": feed})
        np.testing.assert_allclose(got["output"], reference[0], rtol=1e-4, atol=1e-5)
        del scribbles
    finally:
        session.close()
