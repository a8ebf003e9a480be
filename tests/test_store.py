"""The content-addressed store: durable, atomic, never overwrites."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from enginecache.core.store import ArtifactStore, HashingWriter
from enginecache.core.verifiedread import read_verified
from enginecache.errors import IntegrityCheckError, StoreError
from tests.conftest import corrupt_blob, files_under


def test_write_blob_is_content_addressed_and_leaves_no_temp(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    data = os.urandom(3 * 1024 * 1024 + 17)
    blob = store.write_blob([data[:1000], data[1000:]])
    digest = hashlib.sha256(data).hexdigest()
    assert blob.sha256 == digest
    assert blob.size == len(data)
    assert blob.path == tmp_path / "objects" / "sha256" / digest[:2] / digest
    assert blob.path.read_bytes() == data
    assert blob.created is True
    stored = [Path("gc.lock"), Path("objects", "sha256", digest[:2], digest)]  # the lock publishing takes, the blob
    assert files_under(tmp_path) == stored, "no temp file left"


def test_same_bytes_twice_keep_the_first_copy(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    first = store.write_blob([b"engine bytes"])
    inode = first.path.stat().st_ino
    second = store.write_blob([b"engine bytes"])
    assert second.created is False
    assert second.path == first.path
    assert first.path.stat().st_ino == inode, "an existing blob is never replaced"


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)

    def explode(writer: HashingWriter) -> None:
        writer.write(b"half an engine")
        raise OSError("disk full")

    with pytest.raises(StoreError, match="disk full"):
        store._publish(explode)
    assert list(store.tmp_dir.iterdir()) == []
    assert list(store.objects_dir.rglob("*")) == []


def test_ingest_file_and_verify(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    source = tmp_path / "engine.plan"
    source.write_bytes(os.urandom(100_000))
    blob = store.ingest_file(source)
    assert store.verify_blob(blob.sha256).blake3 == blob.blake3
    assert read_verified(blob.path, blake3_digest=blob.blake3) == source.read_bytes()
    corrupt_blob(blob.path, 5000)
    with pytest.raises(IntegrityCheckError, match="hashes to"):
        store.verify_blob(blob.sha256)
    with pytest.raises(IntegrityCheckError, match="blake3"):
        read_verified(blob.path, blake3_digest=blob.blake3)
    with pytest.raises(IntegrityCheckError, match="sha256"):
        read_verified(blob.path, sha256=blob.sha256)
    blob.path.unlink()
    with pytest.raises(IntegrityCheckError, match="missing"):
        store.verify_blob(blob.sha256)


def test_blob_path_rejects_non_digests(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="not a sha256"):
        ArtifactStore(tmp_path).blob_path("../../etc/passwd")


def test_model_bundle_is_stored_once(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "store")
    src = tmp_path / "src"
    src.mkdir()
    (src / "m.onnx").write_bytes(b"model")
    (src / "w.data").write_bytes(b"weights")
    stored = store.put_model_bundle(src / "m.onnx", ["w.data"], "d" * 64)
    assert stored.read_bytes() == b"model"
    assert (stored.parent / "w.data").read_bytes() == b"weights"
    (src / "m.onnx").write_bytes(b"changed")
    again = store.put_model_bundle(src / "m.onnx", ["w.data"], "d" * 64)
    assert again.read_bytes() == b"model", "an existing bundle is never overwritten"
    assert list(store.tmp_dir.iterdir()) == []


def test_republishing_repairs_a_damaged_blob(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path)
    data = os.urandom(50_000)
    blob = store.write_blob([data])
    corrupt_blob(blob.path, 100)
    assert blob.path.read_bytes() != data
    again = store.write_blob([data])
    assert again.created is True, "the damaged copy was replaced"
    assert blob.path.read_bytes() == data
    assert store.verify_blob(blob.sha256).sha256 == blob.sha256


def test_a_store_that_cannot_make_its_folders_is_unavailable_not_bad_input(tmp_path: Path) -> None:
    """An OSError making the store's folders (here: the home is under a file) is a StoreError, exit 3."""
    from enginecache.errors import EXIT_UNAVAILABLE, exit_code_for

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    store = ArtifactStore(blocker / "home")
    with pytest.raises(StoreError, match="could not create the store's folder") as raised:
        store.ensure()
    assert exit_code_for(raised.value) == EXIT_UNAVAILABLE
    with pytest.raises(StoreError), store.temp_dir():
        pass
