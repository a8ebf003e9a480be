"""The S3 server SIGKILLed while a large multipart upload is in flight (tests/s3kit.py): no blob is
visible half-written, the publish raises StoreError and publishes nothing locally either, and the
same publish succeeds once the server is back.

The upload goes through `GatedProxy`, which lets the first part through and holds the rest: the kill
lands part way through the upload on any machine, not when a sleep guesses it might."""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.core.objectstore import blob_key
from enginecache.core.store import ArtifactStore, BlobInfo
from enginecache.errors import StoreError
from tests.s3kit import BUCKET, GatedProxy, S3Server, running_server, use_env, wait_for

MIB = 1024 * 1024
BLOB_BYTES = 24 * MIB  # five 5 MiB parts
PART_BYTES = 5 * MIB
DEADLINE_SECONDS = 120.0


@pytest.fixture
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


@pytest.mark.slow
def test_a_server_killed_mid_upload_leaves_no_blob_and_a_retry_succeeds(
    server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"crash-{uuid.uuid4().hex[:12]}"
    data = (hashlib.sha256(b"large engine").digest() * (BLOB_BYTES // 32))[:BLOB_BYTES]
    sha256 = hashlib.sha256(data).hexdigest()
    source = tmp_path / "engine.plan"
    source.write_bytes(data)
    key = f"{prefix}/{blob_key(sha256)}"
    transfer = {
        "ENGINECACHE_STORE_MULTIPART_MB": "5",
        "ENGINECACHE_STORE_CHUNK_MB": "5",
        "ENGINECACHE_STORE_CONCURRENCY": "1",  # one part at a time: the first is whole when the gate shuts
        "ENGINECACHE_STORE_RETRY_SECONDS": "3",
    }
    proxy = GatedProxy(server.port)
    try:
        use_env(monkeypatch, server.env(prefix, endpoint=proxy.endpoint, **transfer))
        store = ArtifactStore(tmp_path / "home")
        proxy.hold_after(PART_BYTES + PART_BYTES // 2)  # part 1, the head of part 2
        outcome: dict[str, BaseException | BlobInfo] = {}

        def publish() -> None:
            try:
                outcome["result"] = store.ingest_file(source)
            except BaseException as err:  # noqa: BLE001 (handed to the test thread, which asserts on it)
                outcome["result"] = err

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        assert proxy.holding.wait(DEADLINE_SECONDS), "the upload never reached the gate"

        def first_part_stored() -> bool:
            uploads = server.uploads(prefix)
            return len(uploads) == 1 and len(uploads[0]["Parts"]) >= 1

        wait_for(first_part_stored, "the server to hold part 1 of the upload", DEADLINE_SECONDS)
        (upload,) = server.uploads(prefix)
        assert upload["Key"] == key
        assert [part["Size"] for part in upload["Parts"]] == [PART_BYTES]
        assert server.keys(prefix) == []  # in flight, part way: nothing is visible under the key
        server.kill()
    finally:
        proxy.close()
    publisher.join(DEADLINE_SECONDS)
    assert not publisher.is_alive(), "the publish did not end after the server died"
    error = outcome["result"]
    assert isinstance(error, StoreError), error
    assert sha256 in str(error)
    assert not store.blob_path(sha256).exists()  # the remote failed: not published here either
    assert list(store.tmp_dir.iterdir()) == []

    server.restart()
    assert server.keys(prefix) == []
    assert server.uploads(prefix) == []
    use_env(monkeypatch, server.env(prefix, **transfer))  # the new server's keys, no proxy
    info = ArtifactStore(tmp_path / "home").ingest_file(source)
    assert (info.sha256, info.size, info.created) == (sha256, BLOB_BYTES, True)
    assert server.keys(prefix) == [key]
    head = server.s3().head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == BLOB_BYTES
    assert head["ETag"].strip('"').endswith("-5")  # it went up in parts
    fetched = ArtifactStore(tmp_path / "elsewhere").fetch_blob(sha256, size=BLOB_BYTES)
    assert fetched.read_bytes() == data
