"""Model bundles in the remote store (core.bundleremote): `model add` with ENGINECACHE_STORE set puts
the bundle's files into the bucket, and a build host with a home of its own (no shared folder, one
catalog) fetches the bundle, verified, and builds from it; a remote file that is not the registered
bytes is refused and nothing is left on the build host."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from enginecache.core.blobpaths import model_dir
from enginecache.core.objectstore import blob_key
from enginecache.db.models import EngineStatus
from enginecache.errors import BuildFailedError, IntegrityCheckError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.modelfactory import make_external_data_model, make_mlp
from tests.s3kit import BUCKET, S3Server, running_server


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


@pytest.fixture
def prefix(server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    for key, value in server.env(name).items():
        monkeypatch.setenv(key, value)
    return name


def test_model_add_puts_every_file_of_the_bundle_into_the_bucket(
    server: S3Server, prefix: str, app_ctx: AppContext, tmp_path: Path
) -> None:
    model = register_model(app_ctx, make_external_data_model(tmp_path / "ext"), name="ext").model
    files = model.info["remote_files"]
    assert set(files) == {model.filename, *model.info["external_data_files"]}
    stored = set(server.keys(prefix))
    for name, (sha256, size) in files.items():
        assert f"{prefix}/{blob_key(str(sha256))}" in stored
        assert (model_dir(app_ctx.home, model.digest) / name).stat().st_size == size


def test_model_add_hashes_each_file_in_the_pass_that_copies_it_not_again_for_the_upload(
    server: S3Server, prefix: str, app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enginecache.core import bundleremote, hashing

    def no_second_read(path: Path, **_: object) -> hashing.DigestResult:
        raise AssertionError(f"{path} was read again to be hashed for the upload")

    monkeypatch.setattr(bundleremote, "hash_file", no_second_read)
    source = make_external_data_model(tmp_path / "ext")
    model = register_model(app_ctx, source, name="ext").model
    for name, (sha256, size) in model.info["remote_files"].items():
        original = hashing.hash_file(source.parent / name)  # the bytes copied in, hashed on their own
        assert (sha256, size) == (original.sha256, original.size)


def test_a_build_host_with_its_own_home_fetches_the_bundle_and_builds(
    prefix: str, app_ctx: AppContext, app_factory: Callable[..., AppContext], tmp_path: Path
) -> None:
    register_model(app_ctx, make_external_data_model(tmp_path / "ext"), name="ext")
    build_host = app_factory(home=tmp_path / "build-host", db_url=app_ctx.db_url)
    model = register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    assert not model_dir(build_host.home, model.digest).exists()
    for name in ("mlp", "ext"):
        engine = build_engine(build_host, BuildRequest(model=name, backend="ort")).engine
        assert engine.status == EngineStatus.READY
    assert (model_dir(build_host.home, model.digest) / model.filename).read_bytes() == (
        model_dir(app_ctx.home, model.digest) / model.filename
    ).read_bytes()


def test_a_remote_file_that_is_not_the_registered_bytes_is_refused(
    server: S3Server, prefix: str, app_ctx: AppContext, app_factory: Callable[..., AppContext], tmp_path: Path
) -> None:
    model = register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    sha256, size = model.info["remote_files"][model.filename]
    key = f"{prefix}/{blob_key(str(sha256))}"
    body = bytearray(server.s3().get_object(Bucket=BUCKET, Key=key)["Body"].read())
    body[size // 2] ^= 0xFF  # same size, other bytes
    server.s3().put_object(Bucket=BUCKET, Key=key, Body=bytes(body))
    build_host = app_factory(home=tmp_path / "build-host", db_url=app_ctx.db_url)
    with pytest.raises(BuildFailedError) as failed:
        build_engine(build_host, BuildRequest(model="mlp", backend="ort"))
    assert isinstance(failed.value.__cause__, IntegrityCheckError) or "hashes to" in str(failed.value)
    assert not model_dir(build_host.home, model.digest).exists(), "no half or wrong bundle is left"
    assert not any((build_host.home / "tmp").iterdir()), "the staging folder is removed"
