"""A build with ENGINECACHE_STORE set publishes its engine to the S3 server (a real ONNX Runtime build
of a tiny model); a build whose remote is down fails as the queue retries, not as a bad input."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.core.objectstore import blob_key
from enginecache.core.store import ArtifactStore
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import BuildFailedError, StoreError
from enginecache.service.builds.buildjob import causes, failure_is_transient
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.modelfactory import make_mlp
from tests.s3kit import BUCKET, REGION, S3Server, free_port, running_server, use_env


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


@pytest.mark.slow
def test_a_build_publishes_its_engine_to_the_bucket(
    server: S3Server, app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"build-{uuid.uuid4().hex[:12]}"
    use_env(monkeypatch, server.env(prefix))
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    assert engine.status == EngineStatus.READY
    assert engine.sha256 is not None
    key = f"{prefix}/{blob_key(engine.sha256)}"
    assert key in server.keys(prefix)
    head = server.s3().head_object(Bucket=BUCKET, Key=key)
    assert (head["ContentLength"], head["Metadata"]) == (engine.size_bytes, {"sha256": engine.sha256})
    local = app_ctx.store.blob_path(engine.sha256).read_bytes()
    fetched = ArtifactStore(tmp_path / "serving-host").fetch_blob(engine.sha256, size=engine.size_bytes)
    assert fetched.read_bytes() == local
    assert hashlib.sha256(local).hexdigest() == engine.sha256


def test_a_build_whose_remote_is_down_fails_transiently(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")  # before the remote (it would refuse)
    use_env(
        monkeypatch,
        {
            "ENGINECACHE_STORE": f"s3://{BUCKET}/down",
            "AWS_ACCESS_KEY_ID": "x",
            "AWS_SECRET_ACCESS_KEY": "y",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",  # nothing listens there
            "AWS_REGION": REGION,
            "ENGINECACHE_STORE_RETRY_SECONDS": "1",
        },
    )
    with pytest.raises(BuildFailedError) as failed:
        build_engine(app_ctx, BuildRequest(model="mlp", backend="ort"))
    assert any(isinstance(cause, StoreError) for cause in causes(failed.value))
    assert failure_is_transient(failed.value)  # a queued attempt is retried, not FAILED for good
    with app_ctx.catalog.read() as session:
        row = session.get(EngineRecord, failed.value.engine_id)
        assert row is not None
        assert row.status == EngineStatus.FAILED
        assert row.sha256 is None
    assert not any(path.is_file() for path in app_ctx.store.objects_dir.rglob("*"))


def test_a_serving_host_without_the_blob_loads_it_from_the_bucket_verified(
    server: S3Server, app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load path (`service.serving.engineload`, both load_or_build paths use it) fetches a blob this host's
    store lacks from the remote, verified, then reads it; a tampered remote copy is CORRUPT."""
    from enginecache.core.backends.base import PhaseTimer
    from enginecache.errors import EngineRejectedError
    from enginecache.service.serving.engineload import EngineFacts, load_engine

    prefix = f"serve-{uuid.uuid4().hex[:12]}"
    use_env(monkeypatch, server.env(prefix))
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    row = {**engine.model_dump(), "build_options": engine.build_options}
    serving_home = tmp_path / "serving-host"  # a store of its own: the blob is not there
    facts = EngineFacts.from_row(serving_home, row)
    assert not facts.blob.exists()
    corrupted: list[int] = []
    session = load_engine(facts, PhaseTimer(), on_corrupt=lambda _reason: corrupted.append(1))
    session.close()
    assert facts.blob.read_bytes() == app_ctx.store.blob_path(engine.sha256 or "").read_bytes()

    other = EngineFacts.from_row(tmp_path / "another-host", row)
    server.s3().put_object(Bucket=BUCKET, Key=f"{prefix}/{blob_key(engine.sha256 or '')}", Body=b"not the engine")
    with pytest.raises(EngineRejectedError) as rejected:
        load_engine(other, PhaseTimer(), on_corrupt=lambda _reason: corrupted.append(1))
    assert rejected.value.verdict == "CORRUPT" and corrupted == [1] and not other.blob.exists()


def test_pull_on_a_host_without_the_store_folder_fetches_from_the_bucket(
    server: S3Server, app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enginecache.service.fleet.pull import pull

    use_env(monkeypatch, server.env(f"pull-{uuid.uuid4().hex[:12]}"))
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    local = app_ctx.store.blob_path(engine.sha256 or "")
    data = local.read_bytes()
    local.chmod(0o644)
    local.unlink()  # this host sees the catalog but not the build pool's store folder
    result = pull(app_ctx, "mlp", tmp_path / "engines")
    assert result.copied_bytes == len(data) and (tmp_path / "engines" / result.manifest["blob"]).read_bytes() == data
