"""Chunk digests: recorded in the pass that hashes a blob, checked chunk by chunk by a verified read,
and a bad byte named by its chunk and byte range.

Expected digests are computed here with `blake3` directly over slices of the bytes, not with the
module under test. Small files use a small chunk size (`chunk_bytes` passed in, or the module's
constant patched); one test uses a 2 GiB blob with the real chunk size.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import blake3
import numpy as np
import pytest
from sqlmodel import select

from enginecache.core import chunkdigests, hashing, verifiedread
from enginecache.core.blobpaths import blob_path
from enginecache.core.chunkdigests import ChunkDigests, ChunkHasher, decode
from enginecache.core.hashing import StreamHasher, hash_file, verify_file
from enginecache.core.store import ArtifactStore
from enginecache.core.verifiedread import read_verified, read_verified_into
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import EngineRejectedError, IntegrityCheckError
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine, verify_engines
from enginecache.service.models.register import register_model
from enginecache.service.models.verify import verify_models
from tests.conftest import corrupt_blob, leased_mapping
from tests.modelfactory import make_external_data_model
from tests.servingkit import LOAD_PATHS, ORT, Served, load_through, serve_mlp

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def expected_chunks(data: bytes, chunk_bytes: int) -> str:
    digests = [blake3.blake3(data[i : i + chunk_bytes]).hexdigest() for i in range(0, len(data), chunk_bytes)]
    return f"{chunk_bytes}:{''.join(digests)}"


def _mapped(path: Path, **expected: str) -> bytes:
    """The file checked as a load checks it for a runtime that deserializes from memory (TensorRT),
    as bytes; the mapping is gone afterwards."""
    with leased_mapping(path, **expected) as view:
        assert view.readonly, "a runtime could write the checked bytes"
        assert isinstance(view.obj, mmap.mmap) or not view.nbytes, "not a mapping of the file"
        return bytes(view)


def _copied(path: Path, **expected: str) -> bytes:
    """`read_verified`: the file read into a new buffer while it is hashed (where no lease can be had)."""
    return read_verified(path, as_bytes=True, **expected)


# The two ways a load checks a blob's bytes before a runtime sees them.
READS = [pytest.param(_copied, id="copy"), pytest.param(_mapped, id="leased-mapping")]
Read = Callable[..., bytes]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Chunks of 64 KiB, and the threaded read from 128 KiB up; returns the chunk size."""
    monkeypatch.setattr(chunkdigests, "CHUNK_DIGEST_BYTES", 64 * KiB)
    monkeypatch.setattr(verifiedread, "LARGE_READ_BYTES", 128 * KiB)
    monkeypatch.setattr(verifiedread, "PIPELINE_BYTES", 128 * KiB)
    monkeypatch.setattr(hashing, "PIPELINE_BYTES", 128 * KiB)
    return 64 * KiB


@pytest.mark.parametrize("pieces", [1, 999, 64 * KiB, 100_000])
def test_chunk_digests_do_not_depend_on_how_the_bytes_arrive(pieces: int) -> None:
    data = np.random.default_rng(pieces).bytes(300_001)
    hasher = ChunkHasher(64 * KiB)
    for start in range(0, len(data), pieces):
        hasher.update(data[start : start + pieces])
    assert hasher.encoded() == expected_chunks(data, 64 * KiB)
    assert decode(hasher.encoded()) == ChunkDigests(
        64 * KiB, tuple(blake3.blake3(data[i : i + 64 * KiB]).hexdigest() for i in range(0, len(data), 64 * KiB))
    )


@pytest.mark.parametrize("size", [0, 1, 64 * KiB])
def test_a_blob_of_at_most_one_chunk_records_no_list(size: int) -> None:
    hasher = ChunkHasher(64 * KiB)
    hasher.update(bytes(size))
    assert hasher.encoded() == ""
    assert decode("") is None and decode(None) is None


def test_the_store_records_chunk_digests_with_the_identity(tmp_path: Path) -> None:
    """Real chunk size: a blob of two chunks and a byte."""
    data = np.random.default_rng(1).bytes(2 * chunkdigests.CHUNK_DIGEST_BYTES + 1)
    (tmp_path / "engine.bin").write_bytes(data)
    blob = ArtifactStore(tmp_path / "home").ingest_file(tmp_path / "engine.bin")
    assert blob.chunk_blake3 == expected_chunks(data, chunkdigests.CHUNK_DIGEST_BYTES)
    assert len(decode(blob.chunk_blake3).digests) == 3  # type: ignore[union-attr]
    assert hash_file(tmp_path / "engine.bin").chunk_blake3 == blob.chunk_blake3
    assert StreamHasher(with_blake3=False).result().chunk_blake3 == ""


@pytest.mark.parametrize(
    "text",
    ["65536", "x:" + "a" * 64, "65536:" + "a" * 63, "65536:" + "g" * 64, "65536:" + "A" * 64, "0:" + "a" * 64],
)
def test_a_malformed_list_is_refused_not_ignored(text: str) -> None:
    with pytest.raises((IntegrityCheckError, ValueError)):
        decode(text)


@pytest.mark.parametrize("as_bytes", [False, True])
def test_a_read_checks_every_chunk_and_returns_the_bytes(tmp_path: Path, small_chunks: int, as_bytes: bool) -> None:
    data = np.random.default_rng(2).bytes(10 * small_chunks + 17)
    (tmp_path / "blob").write_bytes(data)
    chunks = expected_chunks(data, small_chunks)
    b3 = blake3.blake3(data).hexdigest()
    assert read_verified(tmp_path / "blob", blake3_digest=b3, chunk_blake3=chunks, as_bytes=as_bytes) == data
    target = bytearray(len(data) + 5)
    assert read_verified_into(tmp_path / "blob", target, blake3_digest=b3, chunk_blake3=chunks) == len(data)
    assert target[: len(data)] == data


@pytest.mark.parametrize("size", [0, 1, 64 * KiB, 10 * 64 * KiB + 17])
def test_a_leased_mapping_is_the_file_checked_chunk_by_chunk(tmp_path: Path, small_chunks: int, size: int) -> None:
    data = np.random.default_rng(2).bytes(size)
    (tmp_path / "blob").write_bytes(data)
    b3 = blake3.blake3(data).hexdigest()
    chunked = {"chunk_blake3": expected_chunks(data, small_chunks)} if size > small_chunks else {}
    assert _mapped(tmp_path / "blob", blake3_digest=b3, **chunked) == data
    import hashlib

    assert _mapped(tmp_path / "blob", sha256=hashlib.sha256(data).hexdigest()) == data


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("index", [0, 4, 10])
def test_a_flipped_byte_is_named_by_its_chunk_and_range(
    tmp_path: Path, small_chunks: int, index: int, read: Read
) -> None:
    data = bytearray(np.random.default_rng(3).bytes(10 * small_chunks + 17))
    chunks = expected_chunks(bytes(data), small_chunks)
    b3 = blake3.blake3(bytes(data)).hexdigest()
    start = index * small_chunks
    end = min(start + small_chunks, len(data)) - 1
    data[min(start + 5, end)] ^= 0x40
    (tmp_path / "blob").write_bytes(data)
    named = rf"chunk {index} \(bytes {start}-{end}\)"
    with pytest.raises(IntegrityCheckError, match=named):
        read(tmp_path / "blob", blake3_digest=b3, chunk_blake3=chunks)
    with pytest.raises(IntegrityCheckError, match=named):
        verify_file(tmp_path / "blob", blake3_digest=b3, chunk_blake3=chunks)
    with pytest.raises(IntegrityCheckError, match=r"blake3 .* does not match"):  # no list: the whole digest says
        read(tmp_path / "blob", blake3_digest=b3)


@pytest.mark.parametrize("read", READS)
def test_the_lowest_bad_chunk_is_named_whichever_thread_found_it_first(
    tmp_path: Path, small_chunks: int, read: Read
) -> None:
    data = bytearray(np.random.default_rng(4).bytes(8 * small_chunks))
    chunks = expected_chunks(bytes(data), small_chunks)
    data[2 * small_chunks] ^= 1
    data[7 * small_chunks] ^= 1
    (tmp_path / "blob").write_bytes(data)
    with pytest.raises(IntegrityCheckError, match=r"chunk 2 \("):
        read(tmp_path / "blob", blake3_digest="0" * 64, chunk_blake3=chunks)


@pytest.mark.parametrize("read", READS)
def test_a_list_that_does_not_cover_the_file_is_refused(tmp_path: Path, small_chunks: int, read: Read) -> None:
    data = np.random.default_rng(5).bytes(4 * small_chunks)
    chunks = expected_chunks(data, small_chunks)
    (tmp_path / "blob").write_bytes(data + b"tail")  # one chunk more than recorded
    with pytest.raises(IntegrityCheckError, match="cannot cover"):
        read(tmp_path / "blob", blake3_digest=blake3.blake3(data).hexdigest(), chunk_blake3=chunks)


@pytest.mark.parametrize("read", READS)
def test_a_sha256_only_row_ignores_a_chunk_list(tmp_path: Path, small_chunks: int, read: Read) -> None:
    """Chunks are recorded beside a BLAKE3 identity: a row with sha256 alone checks its sha256."""
    import hashlib

    data = np.random.default_rng(6).bytes(4 * small_chunks)
    (tmp_path / "blob").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    assert read(tmp_path / "blob", sha256=sha, chunk_blake3="65536:" + "0" * 256) == data


@pytest.fixture(scope="module")
def two_gib_blob(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """A 2 GiB blob (random head and tail chunks, zeros between, written sparse), its BLAKE3 and its
    chunk list with the real chunk size, both computed here chunk by chunk."""
    path = tmp_path_factory.mktemp("large") / "engine.bin"
    chunk = chunkdigests.CHUNK_DIGEST_BYTES
    size = 2 * GiB
    head = np.random.default_rng(7).bytes(chunk)
    tail = np.random.default_rng(8).bytes(chunk)
    with open(path, "wb") as stream:
        stream.write(head)
        stream.truncate(size - chunk)
        stream.seek(size - chunk)
        stream.write(tail)
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO)
    digests = []
    zeros = bytes(chunk)
    for index in range(size // chunk):
        piece = head if index == 0 else tail if index == size // chunk - 1 else zeros
        whole.update(piece)
        digests.append(blake3.blake3(piece).hexdigest())
    yield path, whole.hexdigest(), f"{chunk}:{''.join(digests)}"
    path.unlink()


def flip(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 0x01]), offset)
    finally:
        os.close(fd)


@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("offset", [17, 1 * GiB + 5, 2 * GiB - 1])
def test_a_flipped_byte_in_a_2_gib_blob_is_named_by_its_chunk(
    two_gib_blob: tuple[Path, str, str], offset: int, read: Read
) -> None:
    path, b3, chunks = two_gib_blob
    chunk = chunkdigests.CHUNK_DIGEST_BYTES
    index = offset // chunk
    flip(path, offset)
    try:
        with pytest.raises(
            IntegrityCheckError, match=rf"chunk {index} \(bytes {index * chunk}-{(index + 1) * chunk - 1}\)"
        ):
            read(path, blake3_digest=b3, chunk_blake3=chunks)
    finally:
        flip(path, offset)


# -- through the catalog: a build records the list, a load checks it, verify adds it -----------


def _engine_with_chunks(app: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Served:
    """An MLP's ORT engine built with 1 KiB chunks (the build runs in this process), so that a
    small engine has a list of several."""
    monkeypatch.setattr(chunkdigests, "CHUNK_DIGEST_BYTES", KiB)
    served = serve_mlp(app, tmp_path / "src", ORT)
    monkeypatch.undo()
    return served


@pytest.mark.parametrize("path", LOAD_PATHS)
def test_a_built_engine_records_its_chunks_and_a_load_names_the_bad_one(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    served = _engine_with_chunks(app_ctx, tmp_path, monkeypatch)
    engine = served.engine
    blob = blob_path(app_ctx.home, engine.sha256)
    data = blob.read_bytes()
    assert engine.chunk_blake3 == expected_chunks(data, KiB) and len(data) > 3 * KiB
    index = len(data) // KiB // 2
    corrupt_blob(blob, index * KiB + 3)
    with pytest.raises(EngineRejectedError) as rejected:
        load_through(served, ORT, path, monkeypatch)
    assert rejected.value.verdict == "CORRUPT"
    assert f"chunk {index} (bytes {index * KiB}-{index * KiB + KiB - 1})" in str(rejected.value)
    assert get_engine(app_ctx, engine.id or 0).status == EngineStatus.CORRUPT


def test_verify_adds_the_chunk_list_a_row_lacks(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = _engine_with_chunks(app_ctx, tmp_path, monkeypatch)
    engine_id = served.engine.id or 0
    with app_ctx.catalog.write() as session:
        row = session.exec(select(EngineRecord).where(EngineRecord.id == engine_id)).one()
        row.chunk_blake3 = None  # as a row recorded before migration 0016
        session.add(row)
    monkeypatch.setattr(chunkdigests, "CHUNK_DIGEST_BYTES", KiB)
    [result] = verify_engines(app_ctx, [engine_id])
    assert result.ok and "chunk digests recorded" in result.message
    assert get_engine(app_ctx, engine_id).chunk_blake3 == served.engine.chunk_blake3


def test_a_model_records_its_files_chunks_and_verify_names_the_bad_one(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's files over one chunk get chunk digests at registration (`models.info`); a verify
    that finds the stored bundle changed names the file and the chunk (1 KiB chunks here)."""
    monkeypatch.setattr(chunkdigests, "CHUNK_DIGEST_BYTES", KiB)
    source = make_external_data_model(tmp_path / "src")
    model = register_model(app_ctx, source, name="ext").model
    data_name = source.name + ".data"
    data = (source.parent / data_name).read_bytes()
    assert model.info["chunk_blake3"][data_name] == expected_chunks(data, KiB) and len(data) > 3 * KiB
    stored = app_ctx.home / "models" / model.digest / data_name
    corrupt_blob(stored, 2 * KiB + 9)
    [result] = verify_models(app_ctx, [model])
    assert not result.ok
    assert f"{data_name}: chunk 2 (bytes {2 * KiB}-{3 * KiB - 1})" in result.message
