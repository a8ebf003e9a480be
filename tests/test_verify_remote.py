"""`enginecache verify --remote` re-hashes each engine's object in a real S3 server (moto) by ranged
reads: a tampered object (other bytes, the same size and metadata) is found, named by its key and
chunk, recorded and audited with the engine left READY; a publish of the blob replaces it, and the
next `verify --remote` finds it whole."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from enginecache.core.chunkdigests import ChunkHasher
from enginecache.core.objectstore import blob_key
from enginecache.db.models import AuditEventRecord, EngineRecord, EngineStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp
from tests.s3kit import BUCKET, S3Server, running_server, use_env

CHUNK = 2048  # the row's chunk list is recorded in chunks this small, so a tiny engine has several


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


def _actions(app: AppContext, engine_id: int) -> list[str]:
    with app.catalog.read() as session:
        rows = session.exec(select(AuditEventRecord).where(AuditEventRecord.target == f"engine {engine_id}")).all()
    return [row.action for row in rows]


def _published_engine(
    app: AppContext, server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[EngineRecord, str]:
    prefix = f"verify-{uuid.uuid4().hex[:12]}"
    use_env(monkeypatch, server.env(prefix))
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine
    assert engine.status == EngineStatus.READY and engine.sha256 is not None and engine.size_bytes is not None
    assert engine.size_bytes > 3 * CHUNK
    hasher = ChunkHasher(CHUNK)
    hasher.update(app.store.blob_path(engine.sha256).read_bytes())
    with app.catalog.changes() as ex:  # the row's chunk list, recorded with small chunks
        ex.run("UPDATE engines SET chunk_blake3 = :c WHERE id = :id", {"c": hasher.encoded(), "id": engine.id})
    return engine, f"{prefix}/{blob_key(engine.sha256)}"


def test_a_tampered_remote_copy_is_found_recorded_and_repaired_by_a_publish(
    server: S3Server,
    app_ctx: AppContext,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, key = _published_engine(app_ctx, server, tmp_path, monkeypatch)
    engine_id = engine.id or 0
    home = ("--home", str(app_ctx.home))
    clean = run_cli(capsys, *home, "verify", "--remote", str(engine_id), "--json")
    assert clean.code == 0, clean.err
    assert clean.json()[0]["ok"] is True
    first = get_engine(app_ctx, engine_id)
    assert first.remote_verified_at is not None and first.remote_problem is None

    s3 = server.s3()
    good = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    tampered = bytearray(good)
    tampered[CHUNK + 10] ^= 0xFF  # in chunk 1
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(tampered), Metadata={"sha256": engine.sha256 or ""})

    bad = run_cli(capsys, *home, "verify", "--remote", "--all")
    assert bad.code == 1
    assert f"objects/sha256/{(engine.sha256 or '')[:2]}/{engine.sha256}" in bad.out
    assert f"chunk 1 (bytes {CHUNK}-{2 * CHUNK - 1})" in bad.out
    found = get_engine(app_ctx, engine_id)
    assert found.status == EngineStatus.READY, "the local blob is fine: the status stays"
    assert found.remote_problem is not None and "chunk 1" in found.remote_problem
    assert "engine.remote_bad" in _actions(app_ctx, engine_id)

    blob = app_ctx.store.blob_path(engine.sha256 or "")
    assert app_ctx.store.ingest_file(blob).sha256 == engine.sha256  # a publish of the same bytes
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == good

    again = run_cli(capsys, *home, "verify", "--remote", str(engine_id))
    assert again.code == 0, again.out + again.err
    assert get_engine(app_ctx, engine_id).remote_problem is None
    assert _actions(app_ctx, engine_id)[-1] == "engine.remote_ok"


def test_a_missing_remote_copy_fails_and_no_remote_is_bad_input(
    server: S3Server,
    app_ctx: AppContext,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    engine, key = _published_engine(app_ctx, server, tmp_path, monkeypatch)
    server.s3().delete_object(Bucket=BUCKET, Key=key)
    gone = run_cli(capsys, *("--home", str(app_ctx.home)), "verify", "--remote", str(engine.id))
    assert gone.code == 1 and "is missing" in gone.out
    monkeypatch.delenv("ENGINECACHE_STORE")
    none = run_cli(capsys, *("--home", str(app_ctx.home)), "verify", "--remote", "--all")
    assert none.code == 2 and "no remote store is set" in none.err
