"""Model integrity on a real store: `verify` re-hashes stored model bundles (sources, converted variants,
external data) and marks a damaged one CORRUPT; a build re-hashes the bundle it reads and refuses a
damaged one; re-adding the original bytes repairs it; loads and `check` take the blob from the path its
digest implies and verify it before any runtime sees its bytes."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.blobpaths import blob_path, model_dir, model_file
from enginecache.core.store import ArtifactStore
from enginecache.db.catalog import MIGRATIONS_DIR, Catalog
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord, ModelStatus
from enginecache.db.reader import head_revision, sqlite_url
from enginecache.errors import BuildFailedError, IntegrityCheckError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import check_engine, get_engine, retire_engine, verify_engines
from enginecache.service.models.register import get_model, model_path, register_model
from enginecache.service.models.verify import verify_models
from enginecache.service.serving import hitpath
from enginecache.service.serving.loading import read_engine
from enginecache.service.serving.runtime import load_or_build
from tests.clirunner import run_cli
from tests.conftest import corrupt_blob
from tests.modelfactory import make_conv, make_external_data_model, make_mlp
from tests.servingkit import ORT, serve_mlp

FP16_ORT = BuildRequest(model="mlp", backend="ort", precision="fp16")


def _cli(app: AppContext, *args: str) -> list[str]:
    return ["--home", str(app.home), "--db", app.db_url, *args]


def _model(app: AppContext, model_id: int) -> ModelRecord:
    with app.catalog.read() as session:
        found = session.get(ModelRecord, model_id)
    assert found is not None
    return found


def _stored(app: AppContext, model: ModelRecord, name: str | None = None) -> Path:
    return app.home / "models" / model.digest / (name or model.filename)


def _set_blob_path(app: AppContext, engine_id: int, value: str) -> None:
    with app.catalog.write() as session:
        row = session.get(EngineRecord, engine_id)
        assert row is not None
        row.blob_path = value
        session.add(row)


# -- the layout ----------------------------------------------------------------------------------


def test_paths_from_digests_are_the_stores_layout(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    digest = "ab" * 32
    assert blob_path(tmp_path, digest) == store.blob_path(digest)
    assert model_dir(tmp_path, digest) == store.model_dir(digest)
    assert model_file(tmp_path, digest, "m.onnx") == store.model_dir(digest) / "m.onnx"
    for bad in ("../../etc/passwd", "AB" * 32, "ab" * 31, "", None):
        with pytest.raises(IntegrityCheckError, match="not a sha256 digest"):
            blob_path(tmp_path, bad)
    for name in ("../x.onnx", "a/b.onnx", "..", ""):
        with pytest.raises(IntegrityCheckError, match="not a plain file name"):
            model_file(tmp_path, digest, name)


# -- verify ---------------------------------------------------------------------------------------


def test_verify_marks_a_flipped_byte_in_a_stored_bundle_corrupt_and_exits_1(
    catalog_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = catalog_ctx
    mlp = register_model(app, make_mlp(tmp_path / "src" / "mlp.onnx"), name="mlp").model
    ext = register_model(app, make_external_data_model(tmp_path / "ext"), name="ext").model
    engine = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine
    clean = run_cli(capsys, *_cli(app, "verify", "--all", "--json"))
    assert clean.code == 0, clean.out + clean.err
    assert [(r["kind"], r["id"], r["ok"]) for r in clean.json()] == [
        ("model", mlp.id, True),
        ("model", ext.id, True),
        ("engine", engine.id, True),
    ]

    corrupt_blob(_stored(app, ext, "ext.onnx.data"))  # the external data file, not the model file
    result = run_cli(capsys, *_cli(app, "verify", "--all", "--json"))
    assert result.code == 1
    document = result.json()  # exactly one JSON document
    models = {r["id"]: r for r in document if r["kind"] == "model"}
    assert models[mlp.id]["ok"] is True and models[mlp.id]["status"] == "OK"
    assert models[ext.id]["ok"] is False and models[ext.id]["status"] == "CORRUPT"
    assert ext.digest in models[ext.id]["message"] and models[ext.id]["digest"] == ext.digest
    assert [r["ok"] for r in document if r["kind"] == "engine"] == [True]
    assert _model(app, ext.id or 0).status == ModelStatus.CORRUPT
    assert _model(app, mlp.id or 0).status == ModelStatus.OK

    text = run_cli(capsys, *_cli(app, "verify", "--model", "ext"))
    assert text.code == 1
    assert f"model {ext.id} (ext): FAILED" in text.out and "CORRUPT" in text.out
    assert run_cli(capsys, *_cli(app, "verify", "--model", "mlp")).code == 0

    _stored(app, mlp).unlink()  # a missing file is CORRUPT too
    [missing] = verify_models(app, [get_model(app, "mlp")])
    assert not missing.ok and missing.status == ModelStatus.CORRUPT and "missing" in missing.message


@pytest.mark.slow
def test_verify_covers_converted_variants(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    built = build_engine(app_ctx, FP16_ORT).engine
    assert built.variant_model_id is not None
    variant = _model(app_ctx, built.variant_model_id)
    corrupt_blob(_stored(app_ctx, variant))
    results = {r.model_id: r for r in verify_models(app_ctx)}
    assert results[variant.id or 0].status == ModelStatus.CORRUPT and not results[variant.id or 0].ok
    assert results[built.model_id].ok
    # A build that needs the variant converts it again from the verified source (the same bytes:
    # repaired in place) rather than building from the damaged copy.
    retire_engine(app_ctx, built.id or 0)
    rebuilt = build_engine(app_ctx, FP16_ORT)
    assert rebuilt.cache_hit is False and rebuilt.engine.status == EngineStatus.READY
    assert any("CORRUPT: converted again" in w for w in rebuilt.engine.warnings)
    assert all(r.ok for r in verify_models(app_ctx)), "the variant's bundle hashes to its digest again"


# -- builds and repair ----------------------------------------------------------------------------


def test_a_build_from_a_damaged_bundle_is_refused_and_re_adding_the_original_repairs_it(
    catalog_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = catalog_ctx
    original = make_mlp(tmp_path / "src" / "mlp.onnx")
    model = register_model(app, original, name="mlp").model
    corrupt_blob(_stored(app, model))  # a weight byte: the model still parses and would build

    with pytest.raises(BuildFailedError) as refused:
        build_engine(app, BuildRequest(model="mlp", backend="ort"))
    message = str(refused.value)
    assert "'mlp'" in message and model.digest in message and "CORRUPT" in message
    assert _model(app, model.id or 0).status == ModelStatus.CORRUPT
    [failed] = _engines(app)
    assert failed.status == EngineStatus.FAILED and model.digest in (failed.error or "")
    cli = run_cli(capsys, *_cli(app, "build", "mlp", "--backend", "ort", "--json"))
    assert cli.code == 1 and model.digest in cli.json()["error"]
    with pytest.raises(BuildFailedError, match="CORRUPT"):  # a converted variant is made from the source
        build_engine(app, BuildRequest(model="mlp", backend="ort", precision="fp16"))

    again = register_model(app, original)
    assert (again.created, again.repaired) == (False, True)
    assert again.model.id == model.id and again.model.status == ModelStatus.OK
    assert _stored(app, model).read_bytes() == original.read_bytes()
    built = build_engine(app, BuildRequest(model="mlp", backend="ort"))
    assert built.cache_hit is False and built.engine.status == EngineStatus.READY
    assert all(r.ok for r in verify_models(app))
    assert register_model(app, original).repaired is False, "an intact bundle is kept as it is"


def test_re_adding_repairs_external_data_and_a_deleted_bundle(app_ctx: AppContext, tmp_path: Path) -> None:
    source = make_external_data_model(tmp_path / "ext")
    model = register_model(app_ctx, source, name="ext").model
    data = _stored(app_ctx, model, "ext.onnx.data")
    corrupt_blob(data)
    assert register_model(app_ctx, source).repaired is True
    assert data.read_bytes() == (source.parent / "ext.onnx.data").read_bytes()
    for path in sorted(model_dir(app_ctx.home, model.digest).iterdir()):
        path.unlink()
    model_dir(app_ctx.home, model.digest).rmdir()
    assert register_model(app_ctx, source).repaired is True
    assert build_engine(app_ctx, BuildRequest(model="ext", backend="ort")).engine.status == EngineStatus.READY


def test_an_edited_store_path_is_not_where_a_build_reads(app_ctx: AppContext, tmp_path: Path) -> None:
    model = register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    other = register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="conv").model
    with app_ctx.catalog.write() as session:
        row = session.get(ModelRecord, model.id)
        assert row is not None
        row.store_path = other.store_path
        session.add(row)
    assert model_path(app_ctx, get_model(app_ctx, "mlp")) == _stored(app_ctx, model)
    built = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    assert [t["name"] for t in built.io] == ["input", "output"]
    assert built.io[0]["shape"][-1] == 16, "built from mlp's bytes, not conv's"


# -- loads and check ------------------------------------------------------------------------------


def _engines(app: AppContext) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(session.exec(sa.select(EngineRecord)).scalars())  # type: ignore[call-overload]


def test_loads_take_the_blob_from_its_digest_not_an_edited_blob_path(app_ctx: AppContext, tmp_path: Path) -> None:
    served = serve_mlp(app_ctx, tmp_path / "src")  # its memo written: the next load may take the hit path
    engine = served.engine
    register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="conv")
    decoy = build_engine(app_ctx, BuildRequest(model="conv", backend="ort")).engine  # another valid blob
    assert decoy.blob_path != engine.blob_path
    _set_blob_path(app_ctx, engine.id or 0, decoy.blob_path or "")
    genuine = blob_path(app_ctx.home, engine.sha256)

    fast = hitpath.try_hit(
        served.onnx_path, ORT, home=app_ctx.home, db_url=app_ctx.db_url, host=None, started=time.perf_counter()
    )
    assert fast is not None and fast.via == "hitpath" and fast.engine_id == engine.id
    assert fast.facts is not None and fast.facts.blob == genuine
    fast.close()
    full = load_or_build(served.onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    assert full.engine_id == engine.id and full.facts is not None and full.facts.blob == genuine
    full.close()
    edited = get_engine(app_ctx, engine.id or 0)
    assert read_engine(app_ctx, edited) == genuine.read_bytes()
    assert edited.status == EngineStatus.READY, "read from the digest's path, so nothing was refused"

    _set_blob_path(app_ctx, engine.id or 0, "objects/sha256/00/missing")
    assert check_engine(app_ctx, engine.id or 0).verdict == "compatible"
    [verified] = verify_engines(app_ctx, [engine.id or 0])
    assert verified.ok and "named another file" in verified.message
    assert get_engine(app_ctx, engine.id or 0).blob_path == app_ctx.store.relative(genuine)


def test_check_says_corrupt_and_never_hands_the_backend_a_tampered_header(
    catalog_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    app = catalog_ctx
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine
    assert check_engine(app, engine.id or 0).verdict == "compatible"
    corrupt_blob(blob_path(app.home, engine.sha256), 8)  # inside the header

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the backend was asked about a blob that does not match its digest")

    monkeypatch.setattr(ORT_BACKEND, "check_compatibility", refuse)
    monkeypatch.setattr(ORT_BACKEND, "check_header", refuse)
    result = run_cli(capsys, *_cli(app, "check", str(engine.id), "--json"))
    assert result.code == 1, result.err
    data = result.json()
    assert data["verdict"] == "corrupt" and "CORRUPT" in data["reason"] and data["id"] == engine.id
    assert get_engine(app, engine.id or 0).status == EngineStatus.CORRUPT


# -- the migration ---------------------------------------------------------------------------------


def _migrate_to(url: str, revision: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))
            config.set_main_option("sqlalchemy.url", url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def _upgrade_keeps_models_ok(url: str) -> None:
    _migrate_to(url, "0008")
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(
                sa.text(
                    "INSERT INTO models (name, digest, filename, store_path, size_bytes, info, recipe, created_at) "
                    "VALUES ('old', :digest, 'm.onnx', 'models/x/m.onnx', 1, '{}', '{}', CURRENT_TIMESTAMP)"
                ),
                {"digest": "cd" * 32},
            )
    finally:
        engine.dispose()
    catalog = Catalog(url)
    try:
        catalog.migrate()
        with catalog.read() as session:
            [model] = session.exec(sa.select(ModelRecord)).scalars()  # type: ignore[call-overload]
            (version,) = session.execute(sa.text("SELECT version_num FROM alembic_version")).one()
    finally:
        catalog.dispose()
    assert model.status == ModelStatus.OK and version == head_revision() >= "0009"


def test_the_model_status_migration_keeps_existing_models_ok(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "catalog.db")
    _upgrade_keeps_models_ok(url)
    with sqlite3.connect(tmp_path / "catalog.db") as connection:
        columns = {row[1]: row for row in connection.execute("PRAGMA table_info(models)")}
    assert columns["status"][3] == 1, "NOT NULL"


def test_the_model_status_migration_on_postgres(pg_url: str) -> None:
    _upgrade_keeps_models_ok(pg_url)
