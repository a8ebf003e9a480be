"""load_or_build: stat-cached digest, verified one-pass read, load events, typed misses, readiness."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from sqlmodel import select

from enginecache.db.models import EngineStatus, LoadEventRecord, StatCacheRecord
from enginecache.errors import EngineQueuedError, EngineRejectedError, MissError, PrecisionError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.submit import get_job
from enginecache.service.context import AppContext
from enginecache.service.engines.loadruns import load_event_stats
from enginecache.service.engines.records import get_engine
from enginecache.service.models.register import register_model
from enginecache.service.serving.readiness import check_ready
from enginecache.service.serving.runtime import RuntimeSpec, load_or_build
from enginecache.service.serving.statcache import onnx_digest
from tests.clirunner import run_cli
from tests.modelfactory import make_external_data_model, make_mlp

ORT = RuntimeSpec(backend="ort")
FEEDS = {"input": np.ones((2, 16), np.float32)}


def _age(*paths: Path) -> None:
    """Set mtimes a minute back: a file hashed right after it was written is racy (re-hashed)."""
    past = time.time() - 60
    for path in paths:
        os.utime(path, (past, past))


def _events(app: AppContext) -> list[LoadEventRecord]:
    """The serving lookups recorded (build requests made on a miss record events of their own)."""
    query = select(LoadEventRecord).where(LoadEventRecord.source == "load_or_build").order_by(LoadEventRecord.id)  # type: ignore[arg-type]
    with app.catalog.read() as session:
        return list(session.exec(query).all())


def test_hit_uses_the_stat_cache_and_records_events(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app = catalog_ctx
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    _age(onnx_path)
    register_model(app, onnx_path, name="mlp")
    engine = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine

    first = load_or_build(onnx_path, spec=ORT, app=app, on_miss="fail")
    assert first.outcome == "hit" and first.engine.id == engine.id
    assert first.infer(FEEDS)["output"].shape == (2, 32)
    assert first.raw is not None and first.raw.__class__.__name__ == "InferenceSession"
    assert {"lookup", "read_verify", "validity", "deserialize"} <= set(first.phases)
    first.close()
    with load_or_build(onnx_path, spec=ORT, app=app, on_miss="fail") as second:
        assert second.outcome == "hit"
    events = _events(app)
    assert [e.outcome for e in events] == ["hit", "hit"]
    assert [e.stat_cache_hit for e in events] == [False, True], "the second call did not re-hash the ONNX"
    assert events[1].model_name == "mlp" and events[1].engine_id == engine.id
    assert events[1].lookup_s is not None and events[1].read_verify_s is not None and events[1].load_s
    stats = load_event_stats(app)
    assert len(stats) == 1 and stats[0]["calls"] == 2 and stats[0]["hit_rate"] == 1.0


def test_stat_cache_is_not_trusted_for_a_changed_file(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_external_data_model(tmp_path / "ext")
    data_file = onnx_path.parent / (onnx_path.name + ".data")
    _age(onnx_path, data_file)
    first = onnx_digest(app_ctx, onnx_path)
    assert first.stat_cache_hit is False
    assert onnx_digest(app_ctx, onnx_path).stat_cache_hit is True
    # Same size, new bytes in the external data file: its mtime/ctime changed, so it is re-hashed.
    raw = bytearray(data_file.read_bytes())
    raw[0] ^= 0xFF
    data_file.write_bytes(bytes(raw))
    _age(data_file)
    changed = onnx_digest(app_ctx, onnx_path)
    assert changed.stat_cache_hit is False and changed.digest != first.digest
    assert onnx_digest(app_ctx, onnx_path).stat_cache_hit is True
    # A file written just now is racy: cached, but re-hashed on the next lookup.
    onnx_path.touch()
    onnx_digest(app_ctx, onnx_path)
    with app_ctx.catalog.read() as session:
        row = session.exec(select(StatCacheRecord)).one()
    assert row.racy is True
    assert onnx_digest(app_ctx, onnx_path).stat_cache_hit is False


def test_changed_model_file_is_a_miss_that_says_so(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    _age(onnx_path)
    register_model(app_ctx, onnx_path, name="mlp")
    build_engine(app_ctx, BuildRequest(model="mlp", backend="ort"))
    assert load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="fail").outcome == "hit"
    make_mlp(onnx_path, seed=3)  # new weights, same path
    _age(onnx_path)
    with pytest.raises(MissError, match="the file's bytes changed"):
        load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    built = load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="build")
    assert built.outcome == "built" and built.engine.status == EngineStatus.READY
    assert built.engine.id != get_engine(app_ctx, 1).id
    assert [e.outcome for e in _events(app_ctx)] == ["hit", "miss", "built"]


def test_miss_explains_the_nearest_engine_and_the_differing_fields(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    register_model(app_ctx, onnx_path, name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm89",))).engine
    with pytest.raises(MissError) as caught:
        load_or_build(onnx_path, spec=RuntimeSpec(backend="rtx", targets=("sm86",)), app=app_ctx, on_miss="fail")
    err = caught.value
    assert str(err).startswith("no engine for mlp rtx fp32")
    assert f"nearest: engine {engine.id} (rtx fp32 SM89) built just now" in str(err)
    assert [d.field for d in err.diffs] == ["target.compute_capabilities"]
    assert err.diffs[0].left == ["sm89"] and err.diffs[0].right == ["sm86"]
    assert err.nearest is not None and err.nearest["id"] == engine.id


@pytest.mark.usefixtures("requires_no_gpu")
def test_rtx_hit_on_a_gpu_less_host_is_rejected_incompatible(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    register_model(app_ctx, onnx_path, name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm86",))).engine
    spec = RuntimeSpec(backend="rtx", targets=("sm86",))
    with pytest.raises(EngineRejectedError) as caught:
        load_or_build(onnx_path, spec=spec, app=app_ctx, on_miss="fail")
    assert caught.value.verdict == "INCOMPATIBLE" and caught.value.engine_id == engine.id
    assert "CUDA" in str(caught.value)
    assert _events(app_ctx)[-1].outcome == "rejected"
    assert get_engine(app_ctx, engine.id or 0).status == EngineStatus.READY


def test_corrupted_blob_is_refused_and_marked_corrupt(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_mlp(tmp_path / "mlp.onnx")
    register_model(app_ctx, onnx_path, name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    blob = app_ctx.home / (engine.blob_path or "")
    raw = bytearray(blob.read_bytes())
    raw[-1] ^= 0x01
    blob.chmod(0o644)
    blob.write_bytes(bytes(raw))
    with pytest.raises(EngineRejectedError, match="CORRUPT") as caught:
        load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="build")
    assert caught.value.verdict == "CORRUPT"
    assert get_engine(app_ctx, engine.id or 0).status == EngineStatus.CORRUPT
    assert _events(app_ctx)[-1].outcome == "rejected"


def test_on_miss_policies(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_mlp(tmp_path / "fresh.onnx")
    with pytest.raises(MissError, match="no model with digest"):
        load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    with pytest.raises(EngineQueuedError) as queued:
        load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="queue")
    job = get_job(app_ctx, queued.value.job_id or 0)
    assert job.kind == "build" and job.status == "QUEUED"
    with pytest.raises(EngineQueuedError) as again:
        load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="queue")
    assert again.value.job_id == job.id, "a second miss joins the queued build"
    built = load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="build")
    assert built.outcome == "built"
    assert built.infer(FEEDS)["output"].shape == (2, 32)
    assert load_or_build(onnx_path, spec=ORT, app=app_ctx, on_miss="fail").outcome == "hit"
    assert [e.outcome for e in _events(app_ctx)] == ["miss", "miss", "miss", "built", "hit"]


@pytest.mark.usefixtures("requires_no_gpu")
def test_ready_probe(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("ENGINECACHE_HOME", str(home))
    app = AppContext.from_settings(home)
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    missing = run_cli(capsys, "ready", "--model", "mlp", "--backend", "ort")
    assert missing.code == 1 and "not ready: no engine for mlp ort fp32" in missing.out
    engine = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine
    build_engine(app, BuildRequest(model="mlp", backend="rtx", targets=("sm86",)))
    ok = run_cli(capsys, "ready", "--model", "mlp", "--backend", "ort", "--json")
    assert ok.code == 0 and ok.json()["ready"] is True and ok.json()["engine_id"] == engine.id
    gpu = run_cli(capsys, "ready", "--model", "mlp", "--backend", "rtx", "--target", "sm86")
    assert gpu.code == 1 and "incompatible" in gpu.out and "no NVIDIA GPU" in gpu.out
    blob = app.home / (engine.blob_path or "")
    blob.chmod(0o644)
    blob.write_bytes(b"x" + blob.read_bytes()[1:])
    assert check_ready(app, "mlp", ORT).ready is False
    assert get_engine(app, engine.id or 0).status == EngineStatus.CORRUPT
    app.close()


def test_a_failing_call_still_records_its_event(app_ctx: AppContext, tmp_path: Path) -> None:
    onnx_path = make_mlp(tmp_path / "model.onnx")
    register_model(app_ctx, onnx_path, name="model")
    with pytest.raises(PrecisionError, match="unknown precision"):
        load_or_build(onnx_path, spec=RuntimeSpec(backend="ort", precision="fp64"), app=app_ctx, on_miss="fail")
    [event] = _events(app_ctx)
    assert event.outcome == "failed" and "unknown precision 'fp64'" in event.reason
    assert event.model_name == "model"
