"""A load checks the engine's header first, on bytes verified against the header digest the store
recorded (engines.header_blake3): a host that cannot run the engine refuses it without reading or
hashing the rest of the blob, and the runtime still never parses a byte that did not match a
recorded digest (service.serving.engineload). TensorRT-RTX builds here and refuses every engine on this
GPU-less host, which is what these tests use; both load paths (the cache hit and the full path)."""

from __future__ import annotations

from pathlib import Path

import blake3
import pytest
from sqlmodel import select

from enginecache.core import verifiedread
from enginecache.core.backends.loadtypes import ENGINE_HEADER_BYTES
from enginecache.core.backends.trt.backend import RTX_BACKEND
from enginecache.core.blobpaths import blob_path
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import EngineRejectedError
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine, verify_engines
from enginecache.service.serving.runtime import RuntimeSpec
from tests.conftest import corrupt_blob
from tests.servingkit import LOAD_PATHS, ORT, Served, events, load_through, refuse, serve_mlp

RTX = RuntimeSpec(backend="rtx", targets=("sm86",))


def _load(served: Served, spec: RuntimeSpec, path: str, monkeypatch: pytest.MonkeyPatch) -> EngineRejectedError:
    """The verdict of one lookup through `path` (the hit path, with the full path refused; or the full path)."""
    with pytest.raises(EngineRejectedError) as rejected:
        load_through(served, spec, path, monkeypatch)
    return rejected.value


@pytest.fixture
def rtx_served(app_ctx: AppContext, tmp_path: Path) -> Served:
    """An MLP's TensorRT-RTX engine, loaded once (refused on this host: the memo is written all the same)."""
    return serve_mlp(app_ctx, tmp_path / "src", RTX)


def _forget_header_digest(app: AppContext, engine_id: int | None, value: str | None = None) -> None:
    """Set the row's header digest as a row built before migration 0015 has it (None), or to `value`."""
    with app.catalog.write() as session:
        row = session.exec(select(EngineRecord).where(EngineRecord.id == engine_id)).one()
        row.header_blake3 = value
        session.add(row)


def _head(app: AppContext, engine: EngineRecord) -> str:
    return blake3.blake3(blob_path(app.home, engine.sha256).read_bytes()[:ENGINE_HEADER_BYTES]).hexdigest()


@pytest.mark.parametrize("spec", [ORT, RTX], ids=["ort", "rtx"])
def test_a_built_engine_records_the_digest_of_its_header(
    app_ctx: AppContext, tmp_path: Path, spec: RuntimeSpec
) -> None:
    engine = serve_mlp(app_ctx, tmp_path / "src", spec).engine
    assert engine.size_bytes is not None and engine.size_bytes > ENGINE_HEADER_BYTES, "a header and a body"
    assert engine.header_blake3 == _head(app_ctx, engine) != engine.blake3


@pytest.mark.usefixtures("requires_no_gpu")
@pytest.mark.parametrize("path", LOAD_PATHS)
def test_an_engine_this_host_cannot_run_is_refused_on_its_verified_header_alone(
    app_ctx: AppContext, rtx_served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    served = rtx_served
    monkeypatch.setattr(verifiedread, "read_verified", refuse("the whole blob was read for a refused header"))
    verdict = _load(served, RTX, path, monkeypatch)
    assert verdict.verdict == "INCOMPATIBLE" and "CUDA" in str(verdict)
    last = events(app_ctx)[-1]
    assert last.outcome == "rejected" and "read_verify" not in last.phases
    assert list(last.phases).index("read_header") < list(last.phases).index("validity")
    assert get_engine(app_ctx, served.engine.id or 0).status == EngineStatus.READY


@pytest.mark.usefixtures("requires_no_gpu")
@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_damaged_header_is_corrupt_before_the_runtime_sees_it(
    app_ctx: AppContext, rtx_served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    served = rtx_served
    corrupt_blob(blob_path(app_ctx.home, served.engine.sha256), 10)  # inside TensorRT-RTX's 64-byte header
    monkeypatch.setattr(RTX_BACKEND, "check_header", refuse("the runtime was handed an unverified header"))
    monkeypatch.setattr(RTX_BACKEND, "load", refuse("the runtime was handed an unverified engine"))
    verdict = _load(served, RTX, path, monkeypatch)
    assert verdict.verdict == "CORRUPT" and "first 4096 bytes" in str(verdict)
    assert get_engine(app_ctx, served.engine.id or 0).status == EngineStatus.CORRUPT


@pytest.mark.usefixtures("requires_no_gpu")
@pytest.mark.parametrize("path", LOAD_PATHS)
def test_an_engine_recorded_without_a_header_digest_is_read_whole_first(
    app_ctx: AppContext, rtx_served: Served, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A row built before migration 0015 has no header digest: the whole blob is verified first, so
    a damaged body is CORRUPT even on a host that would refuse the header."""
    served = rtx_served
    _forget_header_digest(app_ctx, served.engine.id)
    assert _load(served, RTX, path, monkeypatch).verdict == "INCOMPATIBLE"
    last = events(app_ctx)[-1]
    assert "read_header" not in last.phases
    assert list(last.phases).index("read_verify") < list(last.phases).index("validity")
    corrupt_blob(blob_path(app_ctx.home, served.engine.sha256), -1)  # the body's last byte
    assert _load(served, RTX, path, monkeypatch).verdict == "CORRUPT"


@pytest.mark.usefixtures("requires_no_gpu")
@pytest.mark.parametrize("recorded", [None, "0" * 64], ids=["none", "wrong"])
def test_verify_records_the_header_digest_a_row_lacks_or_has_wrong(
    app_ctx: AppContext, rtx_served: Served, monkeypatch: pytest.MonkeyPatch, recorded: str | None
) -> None:
    """`enginecache verify` hashes the whole blob: where it matches, the header's digest from the same
    pass goes on the row, and the next load checks the header first."""
    engine_id = rtx_served.engine.id
    _forget_header_digest(app_ctx, engine_id, recorded)
    [result] = verify_engines(app_ctx, [engine_id or 0])
    assert result.ok and ("header digest recorded" if recorded is None else "was not its header's") in result.message
    assert get_engine(app_ctx, engine_id or 0).header_blake3 == _head(app_ctx, rtx_served.engine)
    assert _load(rtx_served, RTX, "hit", monkeypatch).verdict == "INCOMPATIBLE"
    assert "read_header" in events(app_ctx)[-1].phases and "read_verify" not in events(app_ctx)[-1].phases
