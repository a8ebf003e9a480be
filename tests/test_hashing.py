"""read_verified / read_verified_into: every path returns exactly the file's bytes after checking them.

Digests are computed here with hashlib and blake3 directly, not with the module under test. Files
that change while read are made deterministic: the change happens inside a wrapped `os.fstat`
(after the size is taken, before the first byte is read) or inside a wrapped `os.preadv` (after the
first chunk), never by racing a writer.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest

from enginecache.core import hashing, verifiedread
from enginecache.core.hashing import DigestResult, hash_file
from enginecache.core.verifiedread import read_verified, read_verified_into
from enginecache.errors import IntegrityCheckError

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[1]


def write(path: Path, size: int, seed: int = 0) -> bytes:
    data = np.random.default_rng(seed).bytes(size)
    path.write_bytes(data)
    return data


def digests(data: bytes) -> tuple[str, str]:
    return hashlib.sha256(data).hexdigest(), blake3.blake3(data).hexdigest()


@pytest.fixture
def small_thresholds(monkeypatch: pytest.MonkeyPatch) -> int:
    """Make the large-file machinery (uninitialised huge-page buffer, trailing hash thread) run on
    files of a few hundred KiB, read in 64 KiB chunks; returns the chunk size."""
    monkeypatch.setattr(verifiedread, "LARGE_READ_BYTES", 128 * 1024)
    monkeypatch.setattr(verifiedread, "PIPELINE_BYTES", 128 * 1024)
    monkeypatch.setattr(hashing, "PIPELINE_BYTES", 128 * 1024)
    monkeypatch.setattr(verifiedread, "CHUNK_DIGEST_BYTES", 64 * 1024)  # the ranges a read without chunk digests takes
    return 64 * 1024


SIZES = [0, 1, 4095, 64 * 1024, 64 * 1024 + 1, 300_001]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("as_bytes", [False, True])
@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_every_path_returns_the_files_bytes(
    tmp_path: Path, small_thresholds: int, size: int, as_bytes: bool, algorithm: str
) -> None:
    data = write(tmp_path / "blob", size, seed=size)
    sha, b3 = digests(data)
    expected: dict[str, Any] = {"sha256": sha} if algorithm == "sha256" else {"blake3_digest": b3}
    got = read_verified(tmp_path / "blob", as_bytes=as_bytes, **expected)
    assert type(got) is (bytes if as_bytes else memoryview)
    assert got == data
    assert len(got) == size


@pytest.mark.parametrize("as_bytes", [False, True])
def test_default_thresholds_large_file(tmp_path: Path, as_bytes: bool) -> None:
    """A file past PIPELINE_BYTES with the real chunk size: huge-page buffer plus trailing hash."""
    size = hashing.PIPELINE_BYTES + 3 * MiB + 7
    data = write(tmp_path / "blob", size, seed=7)
    sha, b3 = digests(data)
    options: list[dict[str, Any]] = [{"blake3_digest": b3}, {"sha256": sha}]
    for kwargs in options:
        got = read_verified(tmp_path / "blob", as_bytes=as_bytes, **kwargs)
        assert type(got) is (bytes if as_bytes else memoryview)
        assert got == data


def test_between_thresholds_file(tmp_path: Path) -> None:
    """Uninitialised buffer but no helper thread (LARGE_READ_BYTES <= size < PIPELINE_BYTES)."""
    size = verifiedread.LARGE_READ_BYTES + 12345
    data = write(tmp_path / "blob", size, seed=3)
    sha, b3 = digests(data)
    assert read_verified(tmp_path / "blob", blake3_digest=b3, as_bytes=True) == data
    assert read_verified(tmp_path / "blob", sha256=sha) == data


def test_bytes_results_are_fresh_hashable_objects(tmp_path: Path, small_thresholds: int) -> None:
    data = write(tmp_path / "blob", 300_000)
    _, b3 = digests(data)
    first = read_verified(tmp_path / "blob", blake3_digest=b3, as_bytes=True)
    second = read_verified(tmp_path / "blob", blake3_digest=b3, as_bytes=True)
    assert first is not second
    assert hash(first) == hash(data) == hash(second)
    assert {first: 1}[data] == 1


def test_both_digests_given_checks_blake3(tmp_path: Path) -> None:
    data = write(tmp_path / "blob", 1000)
    _, b3 = digests(data)
    assert read_verified(tmp_path / "blob", sha256="0" * 64, blake3_digest=b3) == data


def test_no_digest_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "blob", 10)
    with pytest.raises(ValueError, match="expected sha256 or blake3"):
        read_verified(tmp_path / "blob")
    with pytest.raises(ValueError, match="expected sha256 or blake3"):
        read_verified_into(tmp_path / "blob", bytearray(10))


@pytest.mark.parametrize("size", [1, 1000, 300_001])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_mismatch_raises(tmp_path: Path, small_thresholds: int, size: int, as_bytes: bool) -> None:
    data = bytearray(write(tmp_path / "blob", size))
    sha, b3 = digests(bytes(data))
    data[size // 2] ^= 0x01  # one flipped bit, same size
    (tmp_path / "blob").write_bytes(data)
    with pytest.raises(IntegrityCheckError, match=r"blake3 .* does not match"):
        read_verified(tmp_path / "blob", blake3_digest=b3, as_bytes=as_bytes)
    with pytest.raises(IntegrityCheckError, match=r"sha256 .* does not match"):
        read_verified(tmp_path / "blob", sha256=sha, as_bytes=as_bytes)


def test_missing_file_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_verified(tmp_path / "absent", sha256="0" * 64)


# -- files that change while read --------------------------------------------------------------


def after_size_is_taken(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Run `action()` right after read_verified took the file's size (inside its `os.fstat`)."""
    real_fstat = os.fstat

    def fstat(fd: int) -> os.stat_result:
        result = real_fstat(fd)
        action()
        return result

    proxy = types.SimpleNamespace(**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
    proxy.fstat = fstat
    monkeypatch.setattr(verifiedread, "os", proxy)


def after_first_chunk(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Run `action()` once, right after the first range was read (other ranges are still to come)."""
    real_preadv = os.preadv
    calls: list[int] = []

    def preadv(fd: int, buffers: Any, offset: int) -> int:
        n = real_preadv(fd, buffers, offset)
        calls.append(offset)
        if len(calls) == 1:
            action()
        return n

    proxy = types.SimpleNamespace(**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
    proxy.preadv = preadv
    monkeypatch.setattr(verifiedread, "os", proxy)


def grow(path: Path, extra: int = 10) -> Any:
    def action() -> None:
        with open(path, "ab") as stream:
            stream.write(b"x" * extra)

    return action


def shrink(path: Path, to: int) -> Any:
    def action() -> None:
        os.truncate(path, to)

    return action


@pytest.mark.parametrize("size", [1000, 300_001])
@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_file_that_grows_after_stat_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: int, size: int, algorithm: str
) -> None:
    path = tmp_path / "blob"
    sha, b3 = digests(write(path, size))
    after_size_is_taken(monkeypatch, grow(path))
    expected: dict[str, Any] = {"sha256": sha} if algorithm == "sha256" else {"blake3_digest": b3}
    with pytest.raises(IntegrityCheckError, match="grew while reading"):
        read_verified(path, **expected)


@pytest.mark.parametrize("size", [1000, 300_001])
def test_file_that_shrinks_after_stat_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: int, size: int
) -> None:
    path = tmp_path / "blob"
    _, b3 = digests(write(path, size))
    after_size_is_taken(monkeypatch, shrink(path, size // 2))
    with pytest.raises(IntegrityCheckError, match="shrank while reading"):
        read_verified(path, blake3_digest=b3, as_bytes=True)


def test_file_truncated_to_empty_after_stat_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "blob"
    sha, _ = digests(write(path, 5000))
    after_size_is_taken(monkeypatch, shrink(path, 0))
    with pytest.raises(IntegrityCheckError, match=r"shrank while reading \(no bytes at 0 of 5000\)"):
        read_verified(path, sha256=sha)


@pytest.mark.parametrize("change", ["grow", "shrink"])
@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_file_that_changes_size_mid_read_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: int, change: str, algorithm: str
) -> None:
    path = tmp_path / "blob"
    size = 300_001  # five chunks: the hash thread is hashing while the file changes
    sha, b3 = digests(write(path, size))
    action = grow(path, 4096) if change == "grow" else shrink(path, 3 * small_thresholds + 5)
    after_first_chunk(monkeypatch, action)
    expected: dict[str, Any] = {"sha256": sha} if algorithm == "sha256" else {"blake3_digest": b3}
    with pytest.raises(IntegrityCheckError, match="grew" if change == "grow" else "shrank"):
        read_verified(path, **expected)


def test_same_size_rewrite_mid_read_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: int
) -> None:
    path = tmp_path / "blob"
    size = 300_001
    _, b3 = digests(write(path, size))

    def rewrite_tail() -> None:
        with open(path, "r+b") as stream:
            stream.seek(size - 100)
            stream.write(b"\0" * 100)

    after_first_chunk(monkeypatch, rewrite_tail)
    with pytest.raises(IntegrityCheckError, match="does not match"):
        read_verified(path, blake3_digest=b3)


def test_file_replaced_after_open_reads_the_opened_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: int
) -> None:
    """The size comes from the open file, so a rename over the path (how the store publishes)
    between open and read changes nothing: the bytes read are the opened file's, checked."""
    path = tmp_path / "blob"
    data = write(path, 300_001)
    _, b3 = digests(data)
    write(tmp_path / "other", 1000, seed=9)
    after_size_is_taken(monkeypatch, lambda: os.replace(tmp_path / "other", path))
    assert read_verified(path, blake3_digest=b3) == data
    assert path.stat().st_size == 1000


# -- read_verified_into ------------------------------------------------------------------------


def test_read_into_a_larger_buffer(tmp_path: Path, small_thresholds: int) -> None:
    data = write(tmp_path / "blob", 300_001)
    sha, b3 = digests(data)
    buffer = bytearray(b"\xaa" * 400_000)
    assert read_verified_into(tmp_path / "blob", buffer, blake3_digest=b3) == len(data)
    assert buffer[: len(data)] == data
    assert buffer[len(data) :] == b"\xaa" * (400_000 - len(data))
    target = np.zeros(300_004 // 4, dtype=np.float32)  # any writable buffer, any format
    assert read_verified_into(tmp_path / "blob", target, sha256=sha) == len(data)  # type: ignore[arg-type]
    assert target.tobytes()[: len(data)] == data


def test_read_into_refuses_small_or_readonly_buffers(tmp_path: Path) -> None:
    data = write(tmp_path / "blob", 1000)
    _, b3 = digests(data)
    with pytest.raises(ValueError, match="do not fit"):
        read_verified_into(tmp_path / "blob", bytearray(999), blake3_digest=b3)
    with pytest.raises(ValueError, match="writable"):
        read_verified_into(tmp_path / "blob", bytes(2000), blake3_digest=b3)


def test_read_into_mismatch_and_size_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "blob"
    sha, _ = digests(write(path, 1000))
    with pytest.raises(IntegrityCheckError, match="does not match"):
        read_verified_into(path, bytearray(1000), sha256="f" * 64)
    after_size_is_taken(monkeypatch, grow(path))
    with pytest.raises(IntegrityCheckError, match="grew"):
        read_verified_into(path, bytearray(2000), sha256=sha)


# -- internals worth pinning -------------------------------------------------------------------


def test_non_cpython_falls_back_to_plain_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small_thresholds: int
) -> None:
    data = write(tmp_path / "blob", 300_001)
    _, b3 = digests(data)
    fake_sys = types.SimpleNamespace(implementation=types.SimpleNamespace(name="pypy"), platform="linux")
    monkeypatch.setattr(verifiedread, "sys", fake_sys)
    got = read_verified(tmp_path / "blob", blake3_digest=b3, as_bytes=True)
    assert type(got) is bytes and got == data


def test_hash_file_and_digest_result(tmp_path: Path) -> None:
    data = write(tmp_path / "blob", 100_000)
    sha, b3 = digests(data)
    head = blake3.blake3(data[: hashing.HEAD_BYTES]).hexdigest()
    assert hash_file(tmp_path / "blob") == DigestResult(sha256=sha, blake3=b3, size=len(data), head_blake3=head)
    assert hash_file(tmp_path / "blob", chunk_bytes=4096).sha256 == sha


@pytest.mark.parametrize("chunk_bytes", [1000, 4096, 5000, 1 << 20])
@pytest.mark.parametrize("size", [0, 100, 4095, 4096, 4097, 100_000])
def test_the_head_digest_covers_exactly_the_first_head_bytes_whatever_the_chunks(
    tmp_path: Path, size: int, chunk_bytes: int
) -> None:
    """The store's header digest (what a load checks the header against) is the BLAKE3 of the first
    HEAD_BYTES bytes, or of all of a shorter file, however the stream arrives; head_digest agrees."""
    data = write(tmp_path / "blob", size)
    head = blake3.blake3(data[: hashing.HEAD_BYTES]).hexdigest()
    assert hash_file(tmp_path / "blob", chunk_bytes=chunk_bytes).head_blake3 == head
    assert hashing.head_digest(data) == head
    assert hashing.StreamHasher(with_blake3=False).result().head_blake3 == ""


STANDALONE_READ = """
import json, sys
from enginecache.core.verifiedread import read_verified
got = read_verified(sys.argv[1], blake3_digest=sys.argv[2])
print(json.dumps({
    "type": type(got).__name__, "readonly": got.readonly, "over": type(got.obj).__name__,
    "ctypes": "ctypes" in sys.modules, "size": got.nbytes,
}))
"""


def test_a_standalone_large_read_imports_no_ctypes(tmp_path: Path) -> None:
    """A verified read into memory that is not `bytes` (a test-load, say) gets a writable view of an
    anonymous mapping, in a new process that never imports ctypes (2-5 ms of its start): only
    `as_bytes=True` needs CPython's C API."""
    size = verifiedread.LARGE_READ_BYTES + 4097
    data = write(tmp_path / "blob", size, seed=11)
    _, b3 = digests(data)
    done = subprocess.run(
        [sys.executable, "-c", STANDALONE_READ, str(tmp_path / "blob"), b3],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"type": "memoryview", "readonly": False, "over": "mmap", "ctypes": False, "size": size}


def test_the_view_of_a_large_read_is_writable_and_outlives_its_reader(tmp_path: Path) -> None:
    """The mapping lives as long as the view: the bytes stay readable and writable once read_verified
    returned, and a write lands in the caller's copy alone."""
    size = verifiedread.LARGE_READ_BYTES + 1
    data = write(tmp_path / "blob", size, seed=12)
    _, b3 = digests(data)
    got = read_verified(tmp_path / "blob", blake3_digest=b3)
    got[0] ^= 0xFF
    assert got[1:] == data[1:] and got[0] == data[0] ^ 0xFF
    assert (tmp_path / "blob").read_bytes() == data


@pytest.mark.parametrize("size", [1, 300_001, hashing.PIPELINE_BYTES + 5])
@pytest.mark.parametrize("algorithm", ["sha256", "blake3"])
def test_verify_file_checks_a_file_where_it_lies(tmp_path: Path, size: int, algorithm: str) -> None:
    data = bytearray(write(tmp_path / "blob", size, seed=size))
    sha, b3 = digests(bytes(data))
    expected: dict[str, Any] = {"sha256": sha} if algorithm == "sha256" else {"blake3_digest": b3}
    assert hashing.verify_file(tmp_path / "blob", **expected) == size
    data[size // 2] ^= 0x01
    (tmp_path / "blob").write_bytes(data)
    with pytest.raises(IntegrityCheckError, match=rf"^the store's blob: {algorithm} .* does not match"):
        hashing.verify_file(tmp_path / "blob", name="the store's blob", **expected)


def test_a_durable_copy_keeps_the_sources_mode_and_its_digests(tmp_path: Path) -> None:
    data = write(tmp_path / "source", 300_001)
    (tmp_path / "source").chmod(0o640)
    got = hashing.copy_hashed(tmp_path / "source", tmp_path / "copy", durable=True)
    assert (got.sha256, got.blake3) == digests(data) and got.size == len(data)
    assert (tmp_path / "copy").read_bytes() == data and (tmp_path / "copy").stat().st_mode & 0o777 == 0o640
    with pytest.raises(FileExistsError):
        hashing.copy_hashed(tmp_path / "source", tmp_path / "copy", durable=True)
