"""An engine is loaded from its store file in place (service.serving.engineload `_load_in_place`), under a
read lease, with no verified copy of ours. Both load paths (the cache hit and the full path), and both
kinds of runtime:

- one that reads files itself (ONNX Runtime, `reads_files`): the file is hashed where it lies, then
  ORT opens it (the memory of a load by hand);
- one that deserializes from memory (TensorRT): the file is mapped read-only, hashed from the mapping
  on every core, and the runtime gets that mapping. No TensorRT engine runs on this machine, so the
  `takes-a-buffer-standing-in-for-tensorrt` cases load the same ORT engine with ORT's backend told it
  does not read files: ORT's `load` then deserializes from the buffer it is handed, as TensorRT's
  `deserialize_cuda_engine` would.

What must hold: no verified copy is made; a changed byte is still CORRUPT before the runtime sees a
byte; a writer arriving during the load sends it down the copying path, which decides; where the
kernel gives no lease, the copying path runs as before. The writer is a real open for writing
(O_NONBLOCK: refused at once while the lease stands), made from inside the runtime's load."""

from __future__ import annotations

import errno
import mmap
import os
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Runtime:
    """How the runtime under test takes the engine: `entry` is the backend method an in-place load calls."""

    reads_files: bool

    @property
    def entry(self) -> str:
        return "load_file" if self.reads_files else "load"


@pytest.fixture(
    params=[
        pytest.param(Runtime(reads_files=True), id="reads-files"),
        pytest.param(Runtime(reads_files=False), id="takes-a-buffer-standing-in-for-tensorrt"),
    ]
)
def runtime(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    kind: Runtime = request.param
    monkeypatch.setattr(ORT_BACKEND, "reads_files", kind.reads_files)
    return kind


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


def _what_the_runtime_got(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each call of ORT's `load` was handed from here on: "mapping" (a read-only view of a
    file mapping), "bytes" (a verified copy), or the type's name."""
    seen: list[str] = []
    real = ORT_BACKEND.load

    def recorded(engine: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(engine, memoryview) and isinstance(engine.obj, mmap.mmap):
            seen.append("mapping" if engine.readonly else "writable mapping")
        else:
            seen.append(type(engine).__name__)
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "load", recorded)
    return seen


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_an_engine_loads_in_place_with_no_copy_of_ours(
    served: Served, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    monkeypatch.setattr(verifiedread, "read_verified", refuse("a verified copy was made"))
    handed = _what_the_runtime_got(monkeypatch)
    with _load(served, path, monkeypatch) as loaded:
        _runs_like_the_model(served, loaded)
        assert "read_verify" in events(served.app)[-1].phases
        if runtime.reads_files:
            assert handed == []
            assert loaded.session.raw._model_path is None, "ORT's wrapper keeps the path of a descriptor now closed"
        else:
            assert handed == ["mapping"], "the runtime was not handed the store file's read-only mapping"


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_changed_byte_is_corrupt_before_the_runtime_sees_the_file(
    served: Served, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    corrupt_blob(served.blob)
    monkeypatch.setattr(ORT_BACKEND, runtime.entry, refuse("the runtime was handed unverified bytes"))
    with pytest.raises(EngineRejectedError) as rejected:
        _load(served, path, monkeypatch)
    assert rejected.value.verdict == "CORRUPT" and "blake3" in str(rejected.value)
    assert str(served.blob) in str(rejected.value), "the error names the store file, not a /proc link"
    assert get_engine(served.app, served.engine.id or 0).status == EngineStatus.CORRUPT


def _writer_arrives_during_the_load(served: Served, runtime: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The runtime's first load with a writer opening the store file first; returns [whether the
    kernel refused that writer], filled in once the load has run."""
    refused: list[bool] = []
    real = getattr(ORT_BACKEND, runtime.entry)

    def with_a_writer(engine: Any, *args: Any, **kwargs: Any) -> Any:
        if not refused:
            try:
                os.close(os.open(served.blob, os.O_WRONLY | os.O_NONBLOCK))
                refused.append(False)
            except BlockingIOError:
                refused.append(True)
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, runtime.entry, with_a_writer)
    return refused


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_writer_during_the_load_sends_it_to_a_verified_copy(
    served: Served, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    refused = _writer_arrives_during_the_load(served, runtime, monkeypatch)
    copies = _count_copies(monkeypatch)
    with _load(served, path, monkeypatch) as loaded:
        assert refused == [True], "the lease let the writer in"
        assert copies == [str(served.blob)], "a load whose lease broke was not read again, verified"
        _runs_like_the_model(served, loaded)


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_file_changed_once_the_lease_broke_is_corrupt(
    served: Served, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The writer's change lands after the runtime read the file: the copy read next catches it."""
    refused = _writer_arrives_during_the_load(served, runtime, monkeypatch)
    handed = _what_the_runtime_got(monkeypatch)
    real = verifiedread.read_verified

    def changed_first(file: Any, **kwargs: Any) -> Any:
        corrupt_blob(Path(file))
        return real(file, **kwargs)

    monkeypatch.setattr(verifiedread, "read_verified", changed_first)
    with pytest.raises(EngineRejectedError) as rejected:
        _load(served, path, monkeypatch)
    assert rejected.value.verdict == "CORRUPT"
    assert refused == [True], "the load in place never ran"
    assert handed == ([] if runtime.reads_files else ["mapping"]), "the changed copy reached the runtime"


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_where_the_kernel_gives_no_lease_the_copy_is_read(
    served: Served, runtime: Runtime, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Someone holds the blob open for writing (so no read lease): the verified copy, as before."""
    copies = _count_copies(monkeypatch)
    monkeypatch.setattr(ORT_BACKEND, "load_file", refuse("ONNX Runtime read a file no lease guarded"))
    handed = _what_the_runtime_got(monkeypatch)
    served.blob.chmod(0o600)
    writer = os.open(served.blob, os.O_WRONLY)
    try:
        loaded = _load(served, path, monkeypatch)
    finally:
        os.close(writer)
    with loaded:
        assert copies == [str(served.blob)]
        assert handed == ["bytes"], "a runtime was handed a mapping no lease guarded"
        _runs_like_the_model(served, loaded)


# -- a runtime that deserializes from memory: the mapping's own life ------------------------------


@pytest.fixture
def buffer_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """ORT's backend told it does not read files: it stands in for TensorRT, handed the mapping."""
    monkeypatch.setattr(ORT_BACKEND, "reads_files", False)


def _mapped_here(path: Path) -> bool:
    """Whether this process maps the file at `path` now (/proc/self/maps names its path)."""
    return any(line.endswith(" " + str(path)) for line in Path("/proc/self/maps").read_text().splitlines())


@pytest.mark.usefixtures("buffer_runtime")
@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_mapping_standing_in_for_tensorrt_is_unmapped_before_the_lease_goes(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    mapped_during: list[bool] = []
    real = ORT_BACKEND.load

    def noted(engine: Any, *args: Any, **kwargs: Any) -> Any:
        mapped_during.append(_mapped_here(served.blob))
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "load", noted)
    with _load(served, path, monkeypatch) as loaded:
        assert mapped_during == [True], "the runtime was not handed the mapping"
        assert not _mapped_here(served.blob), "the blob is still mapped once its load is done"
        _runs_like_the_model(served, loaded)


@pytest.mark.usefixtures("buffer_runtime")
def test_a_runtime_standing_in_for_tensorrt_that_keeps_the_mapping_is_refused(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime that kept a view past its load would read the file with no lease: the load is an ERROR."""
    kept: list[memoryview] = []
    real = ORT_BACKEND.load

    def keeping(engine: Any, *args: Any, **kwargs: Any) -> Any:
        kept.append(memoryview(engine))
        return real(engine, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "load", keeping)
    with pytest.raises(EngineRejectedError) as rejected:
        _load(served, "full", monkeypatch)
    assert rejected.value.verdict == "ERROR" and "kept past its load" in str(rejected.value)
    assert get_engine(served.app, served.engine.id or 0).status == EngineStatus.READY, "the engine is not to blame"
    kept.clear()


@pytest.mark.usefixtures("buffer_runtime")
@pytest.mark.parametrize("path", LOAD_PATHS)
def test_where_the_file_cannot_be_mapped_standing_in_for_tensorrt_the_copy_is_read(
    served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A host that cannot map the blob (ENOMEM: an address-space limit) is not the blob's fault."""

    def no_memory(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOMEM, os.strerror(errno.ENOMEM))

    monkeypatch.setattr(verifiedread, "map_file", no_memory)
    copies = _count_copies(monkeypatch)
    handed = _what_the_runtime_got(monkeypatch)
    with _load(served, path, monkeypatch) as loaded:
        assert copies == [str(served.blob)] and handed == ["bytes"]
        _runs_like_the_model(served, loaded)
    assert get_engine(served.app, served.engine.id or 0).status == EngineStatus.READY
