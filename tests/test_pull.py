"""`pull`: the engine the host selects copied into DEST (a store of its own) with a manifest; idempotent,
resumable, every byte verified before the blob is in place; a clear refusal when no engine fits; the
CLI's `profiles` and `pull` (exit codes for an init container, one JSON document with --json)."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path

import pytest

from enginecache.core.blobpaths import blob_path
from enginecache.db.models import EngineRecord
from enginecache.errors import IntegrityCheckError, NoEngineFitsError, NotFoundError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.profiles import Wanted
from enginecache.service.fleet.pull import MANIFEST_FORMAT, manifest_path, pull
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.enginerows import engine_row_like
from tests.modelfactory import make_mlp


@pytest.fixture
def engines(app_ctx: AppContext, tmp_path: Path) -> dict[str, EngineRecord]:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    return {
        p: build_engine(app_ctx, BuildRequest(model="mlp", backend="ort", precision=p)).engine for p in ("fp32", "fp16")
    }


def _cli(app: AppContext, *args: str) -> list[str]:
    return ["--home", str(app.home), "--db", app.db_url, *args]


def test_pull_copies_the_selected_engine_with_its_manifest_and_then_is_up_to_date(
    app_ctx: AppContext, engines: dict[str, EngineRecord], tmp_path: Path
) -> None:
    dest = tmp_path / "pulled"
    fp16 = engines["fp16"]
    result = pull(app_ctx, "mlp", dest)
    assert result.engine_id == fp16.id and not result.up_to_date and result.copied_bytes == fp16.size_bytes
    blob = dest / result.manifest["blob"]
    assert blob == blob_path(dest, fp16.sha256), "DEST is laid out as a store"
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == fp16.sha256
    assert not stat.S_IMODE(blob.stat().st_mode) & 0o222, "read-only"
    manifest = json.loads(manifest_path(dest, "mlp").read_text())
    assert manifest["format"] == MANIFEST_FORMAT and manifest["model"]["name"] == "mlp"
    assert manifest["engine"]["sha256"] == fp16.sha256 and manifest["engine"]["blake3"] == fp16.blake3
    assert manifest["engine"]["cache_key"] == fp16.cache_key and manifest["engine"]["key_ingredients"]
    assert manifest["selected_for"]["reason"]
    assert list((dest / "tmp").iterdir()) == [], "no partial left"

    again = pull(app_ctx, "mlp", dest)
    assert again.up_to_date and again.copied_bytes == 0 and again.engine_id == fp16.id
    asked = pull(app_ctx, "mlp", tmp_path / "fp32", wanted=Wanted(precision="fp32"))
    assert asked.engine_id == engines["fp32"].id


def test_a_partial_copy_is_resumed_and_a_wrong_one_refused(
    app_ctx: AppContext, engines: dict[str, EngineRecord], tmp_path: Path
) -> None:
    fp16 = engines["fp16"]
    data = blob_path(app_ctx.home, fp16.sha256).read_bytes()
    dest = tmp_path / "pulled"
    partial = dest / "tmp" / f"{fp16.sha256}.partial"
    partial.parent.mkdir(parents=True)
    partial.write_bytes(data[: len(data) // 2])  # what a killed pull left
    resumed = pull(app_ctx, "mlp", dest)
    assert resumed.copied_bytes == len(data) - len(data) // 2, "continued from the partial's size"
    assert (dest / resumed.manifest["blob"]).read_bytes() == data

    other = tmp_path / "other"
    bad = other / "tmp" / f"{fp16.sha256}.partial"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"\0" * 100)  # not the engine's bytes
    with pytest.raises(IntegrityCheckError, match=fp16.sha256):
        pull(app_ctx, "mlp", other)
    assert not bad.exists() and not blob_path(other, fp16.sha256).exists()
    assert not manifest_path(other, "mlp").exists(), "no manifest names a blob that is not whole"
    assert pull(app_ctx, "mlp", other).copied_bytes == len(data), "the next pull starts afresh"


def test_no_engine_that_fits_is_refused_with_every_reason(
    app_ctx: AppContext, engines: dict[str, EngineRecord], tmp_path: Path
) -> None:
    for engine in engines.values():
        with app_ctx.catalog.write() as session:
            row = session.get(EngineRecord, engine.id)
            assert row is not None
            row.targets = "riscv64-rv64gc"  # built for another CPU
            session.add(row)
    with pytest.raises(NoEngineFitsError) as refused:
        pull(app_ctx, "mlp", tmp_path / "pulled")
    assert all(f"engine {e.id}" in str(refused.value) for e in engines.values())
    assert "this host's CPU is" in str(refused.value)
    assert not (tmp_path / "pulled").exists(), "nothing written"
    with pytest.raises(NotFoundError):
        pull(app_ctx, "nope", tmp_path / "pulled")


def test_the_cli_profiles_and_pull(
    app_ctx: AppContext, engines: dict[str, EngineRecord], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine_row_like(app_ctx, engines["fp16"], targets="riscv64-rv64gc")
    listed = run_cli(capsys, *_cli(app_ctx, "profiles", "mlp", "--json"))
    assert listed.code == 0, listed.err
    data = listed.json()
    assert data["selected_engine_id"] == engines["fp16"].id
    assert sorted(p["verdict"] for p in data["profiles"]) == ["compatible", "compatible", "incompatible"]
    text = run_cli(capsys, *_cli(app_ctx, "profiles", "mlp"))
    assert text.code == 0 and f"* {engines['fp16'].id:>5}" in text.out and "incompatible" in text.out
    header = ["engine", "back", "prec", "targets", "verdict", "provenance", "reason"]
    assert text.out.splitlines()[0].split() == header, "a header"
    assert all("built here" in line for line in text.out.splitlines()[1:] if line.strip()), text.out

    dest = tmp_path / "pulled"
    pulled = run_cli(capsys, *_cli(app_ctx, "pull", "mlp", "--dest", str(dest), "--json"))
    assert pulled.code == 0, pulled.err
    assert pulled.json()["engine_id"] == engines["fp16"].id and pulled.json()["up_to_date"] is False
    again = run_cli(capsys, *_cli(app_ctx, "pull", "mlp", "--dest", str(dest)))
    assert again.code == 0 and "up to date" in again.out
    none = run_cli(capsys, *_cli(app_ctx, "pull", "mlp", "--dest", str(dest), "--precision", "int8", "--json"))
    assert none.code == 1 and none.err.startswith("error: ") and none.json()["kind"] == "no_engine_fits"
    unknown = run_cli(capsys, *_cli(app_ctx, "pull", "nope", "--dest", str(dest)))
    assert unknown.code == 2 and unknown.err.startswith("error: ")
