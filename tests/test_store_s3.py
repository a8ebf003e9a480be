"""The S3 blob backend against a real S3-protocol server (tests/s3kit.py: moto's server in a
subprocess on 127.0.0.1, authentication on): publishing, conditional puts, multipart, verified
fetches, tampered objects, wrong keys; and the ENGINECACHE_STORE settings."""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from obstore.exceptions import AlreadyExistsError
from obstore.store import S3Store

from enginecache.core import storeconfig, storeenv
from enginecache.core.blobfetch import ensure_local_blob
from enginecache.core.objectstore import S3BlobStore, blob_key
from enginecache.core.store import ArtifactStore
from enginecache.errors import IntegrityCheckError, StoreError, exit_code_for
from tests.s3kit import BUCKET, REGION, S3Server, free_port, running_server

MIB = 1024 * 1024


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"


def remote_for(server: S3Server, prefix: str, **extra: str) -> S3BlobStore:
    settings = storeconfig.s3_settings(server.env(prefix, **extra))
    assert settings is not None
    return S3BlobStore(settings)


def raw_store(server: S3Server, prefix: str) -> S3Store:
    """obstore straight at the bucket, no enginecache in between: how a test tampers with an object."""
    return S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=server.endpoint,
        region=REGION,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        client_options={"allow_http": True},
    )


def payload(size: int, seed: int = 0) -> bytes:
    return hashlib.sha256(str(seed).encode()).digest() * (size // 32) + b"\x01" * (size % 32)


def blob_file(folder: Path, size: int, seed: int = 0) -> tuple[Path, str]:
    data = payload(size, seed)
    path = folder / f"blob-{seed}-{size}.bin"
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def stored_bytes(server: S3Server, prefix: str, sha256: str) -> bytes:
    return bytes(server.s3().get_object(Bucket=BUCKET, Key=f"{prefix}/{blob_key(sha256)}")["Body"].read())


def local_leftovers(store: ArtifactStore) -> list[Path]:
    return sorted(store.tmp_dir.iterdir()) if store.tmp_dir.is_dir() else []


# -- publishing ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_publish_puts_the_blob_in_the_bucket_under_its_digest(server: S3Server, prefix: str, tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "home", remote=remote_for(server, prefix))
    data = payload(300_000)
    info = store.write_blob([data])
    key = f"{prefix}/objects/sha256/{info.sha256[:2]}/{info.sha256}"
    assert server.keys(prefix) == [key]
    head = server.s3().head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == len(data)
    assert head["Metadata"] == {"sha256": info.sha256}
    assert stored_bytes(server, prefix, info.sha256) == data
    assert info.path.read_bytes() == data
    assert local_leftovers(store) == []


def test_the_remote_comes_from_engine_cache_store(
    server: S3Server, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in server.env(prefix).items():
        monkeypatch.setenv(name, value)
    source, sha256 = blob_file(tmp_path, 1000)
    info = ArtifactStore(tmp_path / "home").ingest_file(source)
    assert info.sha256 == sha256
    assert stored_bytes(server, prefix, sha256) == source.read_bytes()


def test_publishing_again_keeps_the_stored_object(server: S3Server, prefix: str, tmp_path: Path) -> None:
    remote = remote_for(server, prefix)
    source, sha256 = blob_file(tmp_path, 4096)
    assert remote.put_blob(sha256, source, 4096) is True
    key = f"{prefix}/{blob_key(sha256)}"
    before = server.s3().head_object(Bucket=BUCKET, Key=key)
    assert remote.put_blob(sha256, source, 4096) is False  # the same blob: checked, kept
    info = ArtifactStore(tmp_path / "home", remote=remote).ingest_file(source)
    assert info.created is True  # new here; the remote already had it
    after = server.s3().head_object(Bucket=BUCKET, Key=key)
    assert (after["ETag"], after["LastModified"]) == (before["ETag"], before["LastModified"])


def test_a_wrong_secret_is_refused_and_nothing_is_published(server: S3Server, prefix: str, tmp_path: Path) -> None:
    wrong = remote_for(server, prefix, AWS_SECRET_ACCESS_KEY="not-the-secret", ENGINECACHE_STORE_RETRY_SECONDS="2")
    store = ArtifactStore(tmp_path / "home", remote=wrong)
    source, sha256 = blob_file(tmp_path, 2048)
    with pytest.raises(StoreError, match="could not upload"):
        store.ingest_file(source)
    assert server.keys(prefix) == []
    assert not store.blob_path(sha256).exists()  # the remote refused: not published here either
    assert local_leftovers(store) == []
    right = ArtifactStore(tmp_path / "other", remote=remote_for(server, prefix))
    right.ingest_file(source)
    with pytest.raises(StoreError, match="could not look up"):  # a fetch asks the object's size first
        ArtifactStore(tmp_path / "third", remote=wrong).fetch_blob(sha256)


def test_an_unknown_access_key_is_refused(server: S3Server, prefix: str, tmp_path: Path) -> None:
    stranger = remote_for(server, prefix, AWS_ACCESS_KEY_ID="AKIAUNKNOWNUNKNOWN00", ENGINECACHE_STORE_RETRY_SECONDS="2")
    source, sha256 = blob_file(tmp_path, 100)
    with pytest.raises(StoreError):
        stranger.put_blob(sha256, source, 100)
    with pytest.raises(StoreError):
        stranger.stat_blob(sha256)
    assert server.keys(prefix) == []


@pytest.mark.slow
def test_an_unreachable_server_is_store_error(prefix: str, tmp_path: Path) -> None:
    env = {
        "ENGINECACHE_STORE": f"s3://{BUCKET}/{prefix}",
        "AWS_ACCESS_KEY_ID": "x",
        "AWS_SECRET_ACCESS_KEY": "y",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_REGION": REGION,
        "ENGINECACHE_STORE_RETRY_SECONDS": "1",
    }
    settings = storeconfig.s3_settings(env)
    assert settings is not None
    store = ArtifactStore(tmp_path / "home", remote=S3BlobStore(settings))
    with pytest.raises(StoreError) as failed:
        store.write_blob([b"bytes nobody receives"])
    assert list(store.objects_dir.rglob("*")) == []
    said = str(failed.value)  # a pager's line: the key, the endpoint, the client's answer; no dump
    assert "\n" not in said and "Debug source" not in said, said
    assert f"s3://{BUCKET}/{prefix}/objects/sha256/" in said and env["AWS_ENDPOINT_URL"] in said
    assert "Connection refused" in said or "error sending request" in said, said


def test_a_missing_bucket_is_a_configuration_error_naming_the_bucket(server: S3Server, tmp_path: Path) -> None:
    """It was "blob ... is missing" (exit 1, as if the bytes were lost); it is the store's
    configuration (exit 3), with the bucket named."""
    env = {**server.env("p"), "ENGINECACHE_STORE": "s3://no-such-bucket/p"}
    settings = storeconfig.s3_settings(env)
    assert settings is not None
    remote = S3BlobStore(settings)
    blob, digest = blob_file(tmp_path, 64)
    for attempt in (lambda: remote.read_blob(digest, lambda _chunk: None), lambda: remote.put_blob(digest, blob, 64)):
        with pytest.raises(StoreError, match=r"bucket 'no-such-bucket' does not exist at http://") as failed:
            attempt()
        assert not isinstance(failed.value, IntegrityCheckError) and exit_code_for(failed.value) == 3


def test_credentials_from_the_environment_only_never_ask_the_metadata_address() -> None:
    env = {"ENGINECACHE_STORE": f"s3://{BUCKET}/p", "ENGINECACHE_STORE_CREDENTIALS": "env"}
    with pytest.raises(StoreError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not both set"):
        storeconfig.s3_settings(env)
    keys = {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}
    assert storeconfig.s3_settings({**env, **keys}) is not None
    with pytest.raises(StoreError, match="use `env`"):
        storeconfig.s3_settings({**env, "ENGINECACHE_STORE_CREDENTIALS": "imds"})


# -- never overwriting ------------------------------------------------------------------------


def test_a_conditional_put_of_an_existing_key_does_not_overwrite_it(
    server: S3Server, prefix: str, tmp_path: Path
) -> None:
    remote = remote_for(server, prefix)
    source, sha256 = blob_file(tmp_path, 10_000)
    remote.put_blob(sha256, source, 10_000)
    raw = raw_store(server, prefix)
    with pytest.raises(AlreadyExistsError):  # the server itself honours If-None-Match: *
        obstore.put(raw, blob_key(sha256), b"other bytes", mode="create")
    assert stored_bytes(server, prefix, sha256) == source.read_bytes()


@pytest.mark.parametrize("claim", ["the-digest", "another"])
@pytest.mark.parametrize("size", [10_000, 6 * MIB], ids=["single-put", "multipart"])
def test_an_object_that_is_not_the_blob_is_replaced_by_a_publish(
    server: S3Server, prefix: str, tmp_path: Path, size: int, claim: str
) -> None:
    remote = remote_for(server, prefix, ENGINECACHE_STORE_MULTIPART_MB="5", ENGINECACHE_STORE_CHUNK_MB="5")
    source, sha256 = blob_file(tmp_path, size)
    squatter = payload(size, seed=99)  # same size, other bytes: its size and claim are not trusted
    claimed = sha256 if claim == "the-digest" else "0" * 64
    obstore.put(raw_store(server, prefix), blob_key(sha256), squatter, attributes={"sha256": claimed})
    assert remote.put_blob(sha256, source, size) is True
    assert stored_bytes(server, prefix, sha256) == source.read_bytes()
    head = server.s3().head_object(Bucket=BUCKET, Key=f"{prefix}/{blob_key(sha256)}")
    assert head["Metadata"] == {"sha256": sha256}
    assert remote.put_blob(sha256, source, size) is False  # the blob now: kept


def test_a_replace_is_conditional_on_the_etag_that_was_hashed(server: S3Server, prefix: str, tmp_path: Path) -> None:
    remote = remote_for(server, prefix)
    source, sha256 = blob_file(tmp_path, 5000)
    raw = raw_store(server, prefix)
    written = obstore.put(raw, blob_key(sha256), payload(5000, seed=3), attributes={"sha256": sha256})
    newer = payload(5000, seed=4)  # another writer changed the object after it was hashed
    obstore.put(raw, blob_key(sha256), newer, attributes={"sha256": sha256})
    assert remote._replace(blob_key(sha256), sha256, source, 5000, written["e_tag"], None) is False
    assert stored_bytes(server, prefix, sha256) == newer
    assert remote.put_blob(sha256, source, 5000) is True  # checked again, and replaced
    assert stored_bytes(server, prefix, sha256) == source.read_bytes()


def test_an_object_without_a_claim_is_checked_by_its_bytes(server: S3Server, prefix: str, tmp_path: Path) -> None:
    remote = remote_for(server, prefix)
    source, sha256 = blob_file(tmp_path, 5000)
    raw = raw_store(server, prefix)
    obstore.put(raw, blob_key(sha256), source.read_bytes())  # the right bytes, no sha256 metadata
    assert remote.put_blob(sha256, source, 5000) is False
    other, other_sha = blob_file(tmp_path, 5000, seed=1)
    obstore.put(raw, blob_key(other_sha), payload(5000, seed=2))  # wrong bytes, same size, no claim
    assert remote.put_blob(other_sha, other, 5000) is True
    assert stored_bytes(server, prefix, other_sha) == other.read_bytes()


# -- multipart --------------------------------------------------------------------------------


def test_a_large_blob_goes_up_in_parts_of_the_chunk_size(server: S3Server, prefix: str, tmp_path: Path) -> None:
    remote = remote_for(server, prefix, ENGINECACHE_STORE_MULTIPART_MB="8", ENGINECACHE_STORE_CHUNK_MB="5")
    small, small_sha = blob_file(tmp_path, 7 * MIB)
    large, large_sha = blob_file(tmp_path, 12 * MIB, seed=1)
    assert remote.put_blob(small_sha, small, 7 * MIB)
    assert remote.put_blob(large_sha, large, 12 * MIB)
    s3 = server.s3()
    small_head = s3.head_object(Bucket=BUCKET, Key=f"{prefix}/{blob_key(small_sha)}")
    large_head = s3.head_object(Bucket=BUCKET, Key=f"{prefix}/{blob_key(large_sha)}")
    assert "-" not in small_head["ETag"]  # one PUT
    assert large_head["ETag"].strip('"').endswith("-3")  # S3's multipart ETag: 3 parts of 5 MiB
    assert large_head["Metadata"] == {"sha256": large_sha}
    assert stored_bytes(server, prefix, large_sha) == large.read_bytes()
    assert remote.put_blob(large_sha, large, 12 * MIB) is False  # there already: checked, kept


# -- fetching ---------------------------------------------------------------------------------


@pytest.mark.parametrize("size", [70_000, 12 * MIB], ids=["small", "large"])
def test_a_fetch_downloads_the_blob_verified(server: S3Server, prefix: str, tmp_path: Path, size: int) -> None:
    remote = remote_for(server, prefix, ENGINECACHE_STORE_MULTIPART_MB="5", ENGINECACHE_STORE_CHUNK_MB="5")
    publisher = ArtifactStore(tmp_path / "builder", remote=remote)
    info = publisher.write_blob([payload(size)])
    loader = ArtifactStore(tmp_path / "server", remote=remote)
    path = loader.fetch_blob(info.sha256, size=size)
    assert path == loader.blob_path(info.sha256)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == info.sha256
    assert local_leftovers(loader) == []
    assert loader.fetch_blob(info.sha256) == path  # present: no download


@pytest.mark.parametrize(
    ("tampered_size", "recorded"),
    [(0, True), (0, False), (-1, True), (-1, False)],
    ids=["same-size", "same-size-unrecorded", "shorter", "shorter-unrecorded"],
)
def test_a_tampered_remote_object_is_refused_and_leaves_nothing(
    server: S3Server, prefix: str, tmp_path: Path, tampered_size: int, recorded: bool
) -> None:
    remote = remote_for(server, prefix)
    data = payload(200_000)
    sha256 = ArtifactStore(tmp_path / "builder", remote=remote).write_blob([data]).sha256
    wrong = bytearray(data[: len(data) + tampered_size] if tampered_size else data)
    wrong[1000] ^= 0xFF
    obstore.put(raw_store(server, prefix), blob_key(sha256), bytes(wrong), attributes={"sha256": sha256})
    loader = ArtifactStore(tmp_path / "server", remote=remote)
    with pytest.raises(IntegrityCheckError):
        loader.fetch_blob(sha256, size=len(data) if recorded else None)
    assert not loader.blob_path(sha256).exists()
    assert local_leftovers(loader) == []


def test_a_blob_in_neither_place_is_integrity_error(server: S3Server, prefix: str, tmp_path: Path) -> None:
    digest = hashlib.sha256(b"never stored").hexdigest()
    with pytest.raises(IntegrityCheckError, match="missing"):
        ArtifactStore(tmp_path / "home", remote=remote_for(server, prefix)).fetch_blob(digest)
    with pytest.raises(IntegrityCheckError, match="no remote"):
        ArtifactStore(tmp_path / "home", remote=None).fetch_blob(digest)


def test_ensure_local_blob_fetches_only_what_is_missing(
    server: S3Server, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = payload(50_000)
    sha256 = ArtifactStore(tmp_path / "builder", remote=remote_for(server, prefix)).write_blob([data]).sha256
    home = tmp_path / "server"
    monkeypatch.delenv(storeenv.STORE_ENV, raising=False)
    expected = home / "objects" / "sha256" / sha256[:2] / sha256
    assert ensure_local_blob(home, sha256) == expected
    assert not expected.exists()  # no remote set: nothing fetched, the read finds it missing
    for name, value in server.env(prefix).items():
        monkeypatch.setenv(name, value)
    assert ensure_local_blob(home, sha256, size=len(data)) == expected
    assert expected.read_bytes() == data
    os.chmod(expected, 0o444)
    assert ensure_local_blob(home, sha256) == expected  # present: a stat


# -- settings ---------------------------------------------------------------------------------


def test_settings_from_the_environment() -> None:
    assert storeconfig.s3_settings({}) is None
    assert storeconfig.s3_settings({"ENGINECACHE_STORE": "local"}) is None
    assert not storeenv.configured({"ENGINECACHE_STORE": " local "})
    settings = storeconfig.s3_settings(
        {
            "ENGINECACHE_STORE": "s3://bucket/some/prefix/",
            "ENGINECACHE_STORE_CHUNK_MB": "8",
            "ENGINECACHE_STORE_MULTIPART_MB": "100",
            "AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
        }
    )
    assert settings is not None
    assert (settings.bucket, settings.prefix, settings.url) == ("bucket", "some/prefix", "s3://bucket/some/prefix")
    assert (settings.chunk_bytes, settings.multipart_threshold) == (8 * MIB, 100 * MIB)
    assert settings.allow_http
    assert not storeconfig.S3Settings("bucket", endpoint="https://s3.example").allow_http


@pytest.mark.parametrize(
    "env",
    [
        {"ENGINECACHE_STORE": "gs://bucket"},
        {"ENGINECACHE_STORE": "s3://"},
        {"ENGINECACHE_STORE": "s3://b", "ENGINECACHE_STORE_CHUNK_MB": "4"},
        {"ENGINECACHE_STORE": "s3://b", "ENGINECACHE_STORE_RETRY_SECONDS": "soon"},
        {"ENGINECACHE_STORE": "s3://b", "ENGINECACHE_STORE_CONCURRENCY": "-1"},
    ],
)
def test_unusable_settings_are_store_error(env: dict[str, str]) -> None:
    with pytest.raises(StoreError):
        storeconfig.s3_settings(env)
