"""An ORT engine is loaded from its store file in place (service.serving.engineload `_load_in_place`): hashed
where it lies under a read lease, then read by ONNX Runtime itself, so a serving process holds no
copy of ours (the memory of a load by hand). Both load paths (the cache hit and the full path).

What must hold: no verified copy is made; a changed byte is still CORRUPT before the session is
handed out; a writer arriving during the load sends it down the copying path, which decides; where
the kernel gives no lease, the copying path runs as before. The writer is a real open for writing
(O_NONBLOCK: refused at once while the lease stands), made from inside the backend's load."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from enginecache.core import verifiedread
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.db.models import EngineStatus
from enginecache.errors import EngineRejectedError
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.serving.runtimetypes import LoadedEngine
from tests.conftest import corrupt_blob
from tests.servingkit import LOAD_PATHS, ORT, Served, events, load_through, refuse, serve_mlp


@pytest.fixture
def served(app_ctx: AppContext, tmp_path: Path) -> Served:
    return serve_mlp(app_ctx, tmp_path / "src", ORT)


def _load(served: Served, path: str, monkeypatch: pytest.MonkeyPatch) -> LoadedEngine:
    return load_through(served, ORT, path, monkeypatch)


def _runs_like_the_model(served: Served, loaded: LoadedEngine) -> None:
    feed = np.random.default_rng(3).standard_normal((2, 16)).astype(np.float32)
    source = ort.InferenceSession(str(served.onnx_path), providers=["CPUExecutionProvider"])
    reference = source.run(None, {"input": feed})
    np.testing.assert_allclose(loaded.session.infer({"input": feed})["output"], reference[0], rtol=1e-4, atol=1e-5)


def _count_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every verified copy of a whole blob made from here on, by path."""
    copies: list[str] = []
    real = verifiedread.read_verified

    def counted(path: Any, **kwargs: Any) -> Any:
        copies.append(os.fspath(path))
        return real(path, **kwargs)

    monkeypatch.setattr(verifiedread, "read_verified", counted)
    return copies


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_an_ort_engine_loads_in_place_with_no_copy_of_ours(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(verifiedread, "read_verified", refuse("a verified copy was made"))
    with _load(served, path, monkeypatch) as loaded:
        _runs_like_the_model(served, loaded)
        assert loaded.session.raw._model_path is None, "ORT's wrapper keeps the path of a descriptor now closed"
        assert "read_verify" in events(served.app)[-1].phases


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_changed_byte_is_corrupt_before_onnx_runtime_reads_the_file(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    corrupt_blob(served.blob)
    monkeypatch.setattr(ORT_BACKEND, "load_file", refuse("ONNX Runtime was handed an unverified file"))
    with pytest.raises(EngineRejectedError) as rejected:
        _load(served, path, monkeypatch)
    assert rejected.value.verdict == "CORRUPT" and "blake3" in str(rejected.value)
    assert str(served.blob) in str(rejected.value), "the error names the store file, not a /proc link"
    assert get_engine(served.app, served.engine.id or 0).status == EngineStatus.CORRUPT


def _writer_arrives_during_the_load(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """ORT's `load_file` with a writer opening the leased file first; returns [whether the kernel
    refused that writer], filled in once the load has run."""
    refused: list[bool] = []
    real = ORT_BACKEND.load_file

    def with_a_writer(file: str, *args: Any, **kwargs: Any) -> Any:
        try:
            os.close(os.open(file, os.O_WRONLY | os.O_NONBLOCK))
            refused.append(False)
        except BlockingIOError:
            refused.append(True)
        return real(file, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "load_file", with_a_writer)
    return refused


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_writer_during_the_load_sends_it_to_a_verified_copy(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    refused = _writer_arrives_during_the_load(monkeypatch)
    copies = _count_copies(monkeypatch)
    with _load(served, path, monkeypatch) as loaded:
        assert refused == [True], "the lease let the writer in"
        assert copies == [str(served.blob)], "a load whose lease broke was not read again, verified"
        _runs_like_the_model(served, loaded)


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_file_changed_once_the_lease_broke_is_corrupt(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The writer's change lands after ORT read the file: the copy read next catches it."""
    _writer_arrives_during_the_load(monkeypatch)
    real = verifiedread.read_verified

    def changed_first(file: Any, **kwargs: Any) -> Any:
        corrupt_blob(Path(file))
        return real(file, **kwargs)

    monkeypatch.setattr(verifiedread, "read_verified", changed_first)
    with pytest.raises(EngineRejectedError) as rejected:
        _load(served, path, monkeypatch)
    assert rejected.value.verdict == "CORRUPT"


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_where_the_kernel_gives_no_lease_the_copy_is_read(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Someone holds the blob open for writing (so no read lease): the verified copy, as before."""
    copies = _count_copies(monkeypatch)
    monkeypatch.setattr(ORT_BACKEND, "load_file", refuse("ONNX Runtime read a file no lease guarded"))
    served.blob.chmod(0o600)
    writer = os.open(served.blob, os.O_WRONLY)
    try:
        loaded = _load(served, path, monkeypatch)
    finally:
        os.close(writer)
    with loaded:
        assert copies == [str(served.blob)]
        _runs_like_the_model(served, loaded)
