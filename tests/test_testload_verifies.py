"""A test-load that loaded and ran the engine read its whole blob verified against the digest
(`core.validate.read_engine`), so it counts as a verification: `verified_at` is stamped through
`db.engines.mark_verified`, in the run's transaction; a CORRUPT verdict stamps nothing."""

from __future__ import annotations

from pathlib import Path

from enginecache.core.blobpaths import blob_path
from enginecache.db.models import EngineStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.models.register import register_model
from tests.conftest import corrupt_blob
from tests.modelfactory import make_mlp


def _ort_engine(app: AppContext, tmp_path: Path) -> int:
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    return int(build_engine(app, BuildRequest(model="mlp", backend="ort")).engine.id or 0)


def test_a_passing_test_load_stamps_the_engine_verified(app_ctx: AppContext, tmp_path: Path) -> None:
    engine_id = _ort_engine(app_ctx, tmp_path)
    before = get_engine(app_ctx, engine_id)
    assert before.verified_at is None, "built, never re-read"
    run = run_test_load(app_ctx, engine_id, iterations=1)
    assert run.verdict == "PASS", run.reason
    after = get_engine(app_ctx, engine_id)
    assert after.verified_at is not None and after.status == EngineStatus.READY
    assert (after.header_blake3, after.chunk_blake3) == (before.header_blake3, before.chunk_blake3), "kept"


def test_a_corrupt_test_load_stamps_nothing(app_ctx: AppContext, tmp_path: Path) -> None:
    engine_id = _ort_engine(app_ctx, tmp_path)
    corrupt_blob(blob_path(app_ctx.home, get_engine(app_ctx, engine_id).sha256 or ""))
    run = run_test_load(app_ctx, engine_id, iterations=1)
    assert run.verdict == "CORRUPT", run.reason
    after = get_engine(app_ctx, engine_id)
    assert after.verified_at is None and after.status == EngineStatus.CORRUPT
