"""`delete_engine` (admin): the engine RETIRED now and its blob removed now (not after gc's grace),
unless another engine row or an active job still needs the blob; the row kept with its history; a
PENDING engine refused; audited."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from enginecache.core.blobpaths import blob_path
from enginecache.db.models import EngineStatus, utcnow
from enginecache.errors import BadInputError, MissError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.context import AppContext
from enginecache.service.engines.delete import delete_engine
from enginecache.service.engines.records import get_engine
from enginecache.service.maintenance.gc.collect import collect_garbage
from enginecache.service.maintenance.gc.report import GcPolicy
from enginecache.service.serving.runtime import load_or_build
from tests.clirunner import run_cli
from tests.enginerows import engine_row_like
from tests.servingkit import ORT, serve_mlp


def test_delete_retires_and_removes_the_blob_now_keeping_the_row(app_ctx: AppContext, tmp_path: Path) -> None:
    served = serve_mlp(app_ctx, tmp_path / "src")
    engine = served.engine
    blob = blob_path(app_ctx.home, engine.sha256)
    assert blob.exists()
    result = delete_engine(app_ctx, engine.id or 0)
    assert result.blob_removed and result.was == "READY" and engine.sha256 in result.reason
    assert not blob.exists(), "removed now, no grace period"
    row = get_engine(app_ctx, engine.id or 0)
    assert row.status == EngineStatus.RETIRED and row.blob_path is None and row.sha256 == engine.sha256
    actions = [e.action for e in audit.list_audit(app_ctx)]
    assert actions[:2] == [audit.ENGINE_DELETE, audit.ENGINE_RETIRE]
    [event] = audit.list_audit(app_ctx, action=audit.ENGINE_DELETE)
    assert event.target == f"engine {engine.id}" and event.details["blob_removed"] is True
    with pytest.raises(MissError):
        load_or_build(served.onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    later = collect_garbage(app_ctx, policy=GcPolicy(grace=timedelta(0)), clock=lambda: utcnow() + timedelta(days=30))
    assert not [r for r in later.removals if engine.id in r.engine_ids], "nothing left for gc of this engine"


def test_a_blob_another_engine_still_names_is_kept(app_ctx: AppContext, tmp_path: Path) -> None:
    engine = serve_mlp(app_ctx, tmp_path / "src").engine
    twin = engine_row_like(app_ctx, engine)
    result = delete_engine(app_ctx, engine.id or 0)
    assert not result.blob_removed and f"engine {twin.id}" in result.reason
    assert blob_path(app_ctx.home, engine.sha256).exists()
    assert get_engine(app_ctx, engine.id or 0).status == EngineStatus.RETIRED
    assert get_engine(app_ctx, twin.id or 0).status == EngineStatus.READY
    assert delete_engine(app_ctx, twin.id or 0).blob_removed, "the last one to need it removes it"
    assert not blob_path(app_ctx.home, engine.sha256).exists()
    assert get_engine(app_ctx, engine.id or 0).blob_path is None, "every retired row naming it is cleared"


def test_a_pending_engine_or_an_unknown_id_is_refused(app_ctx: AppContext, tmp_path: Path) -> None:
    engine = serve_mlp(app_ctx, tmp_path / "src").engine
    pending = engine_row_like(app_ctx, engine, status=EngineStatus.PENDING, sha256=None, blob_path=None)
    with pytest.raises(BadInputError, match=rf"engine {pending.id} is PENDING"):
        delete_engine(app_ctx, pending.id or 0)
    assert get_engine(app_ctx, pending.id or 0).status == EngineStatus.PENDING
    with pytest.raises(NotFoundError):
        delete_engine(app_ctx, 999)
    assert audit.list_audit(app_ctx, action=audit.ENGINE_DELETE) == []


def test_the_cli_retires_and_deletes(app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    engine = serve_mlp(app_ctx, tmp_path / "src").engine
    where = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    retired = run_cli(capsys, *where, "engine", "retire", str(engine.id), "--json")
    assert retired.code == 0, retired.err
    assert retired.json() == {"id": engine.id, "status": "RETIRED"}
    assert blob_path(app_ctx.home, engine.sha256).exists(), "retire keeps the blob until gc"
    deleted = run_cli(capsys, *where, "engine", "delete", str(engine.id))
    assert deleted.code == 0, deleted.err
    assert f"engine {engine.id} deleted (RETIRED, was RETIRED)" in deleted.out
    assert not blob_path(app_ctx.home, engine.sha256).exists()
    missing = run_cli(capsys, *where, "engine", "delete", "999", "--json")
    assert missing.code == 2 and missing.err.startswith("error: ") and "999" in missing.json()["error"]
