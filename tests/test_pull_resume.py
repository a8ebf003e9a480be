"""`pull` from the object store by parallel ranged GETs, verified chunk by chunk, resumable: a pull
SIGKILLed at about half (a real `enginecache pull` process, stopped by a proxy that holds the
server's answer once half the object went through) leaves nothing outside its resume state, and the
next pull fetches only the chunks it lacks, counted in bytes at the proxy; a flipped byte in the
bucket is named by chunk and byte range; a recorded chunk damaged on disk is fetched again; gc
removes a resume state nobody resumed within its age and keeps a held or young one.

The blob is 32 MiB with chunk digests of 512 KiB (a row recorded with a small chunk size), so the
test takes seconds; the server is moto's (tests/s3kit.py)."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import obstore
import pytest
from obstore.store import S3Store

from enginecache.core import rangedfetch
from enginecache.core.blobpaths import blob_path, blob_relative
from enginecache.core.chunkdigests import ChunkHasher, decode
from enginecache.core.objectstore import blob_key
from enginecache.core.store import ArtifactStore
from enginecache.db.models import EngineRecord
from enginecache.errors import IntegrityCheckError, StoreError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.profiles import Wanted
from enginecache.service.fleet.pull import manifest_path, pull
from enginecache.service.maintenance.gc.report import RESUME_STATE
from enginecache.service.models.register import register_model
from tests.conftest import FakeClock
from tests.enginerows import engine_row_like
from tests.gckit import DAY, HOUR, removed_paths, run_gc, set_age
from tests.modelfactory import make_mlp
from tests.s3kit import BUCKET, REGION, GatedProxy, S3Server, running_server, use_env, wait_for

MIB = 1024 * 1024
BLOB_BYTES = 32 * MIB
CHUNK = 512 * 1024  # 64 chunks
CONCURRENCY = 2
BOUND = 120.0  # seconds: generous; a wait that runs past it is a failure
HEADER_SLACK = 64 * 1024  # the HTTP headers of every answer, together, are far below this


@pytest.fixture(scope="module")
def server() -> Iterator[S3Server]:
    with running_server() as started:
        yield started


def payload(size: int) -> bytes:
    """Bytes that differ in every chunk (a chunk's digest then names that chunk alone)."""
    block = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(size // 32 // 64 + 1))
    return (block * 64)[:size]


def chunk_list(data: bytes) -> str:
    hasher = ChunkHasher(CHUNK)
    hasher.update(data)
    return hasher.encoded()


def engine_with_blob(app: AppContext, tmp_path: Path, data: bytes) -> EngineRecord:
    """A real engine row (an ORT build) copied with the digests of `data`, published to the bucket
    (the builder's home keeps a copy too, as a build's would)."""
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    built = build_engine(app, BuildRequest(model="mlp", backend="ort", precision="fp32")).engine
    info = app.store.write_blob([data])
    return engine_row_like(
        app,
        built,
        sha256=info.sha256,
        blake3=info.blake3,
        header_blake3=info.head_blake3,
        chunk_blake3=chunk_list(data),
        size_bytes=info.size,
        blob_path=blob_relative(info.sha256),
    )


def pull_process(app: AppContext, home: Path, dest: Path, engine_id: int, env: dict[str, str]) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "enginecache.cli", "--home", str(home), "--db", app.db_url]
    command += ["pull", "mlp", "--dest", str(dest), "--engine", str(engine_id), "--json"]
    return subprocess.Popen(
        command, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def recorded_chunks(state: Path) -> int:
    """Ranges the resume state records as landed (its `done` file: a header, then a line each)."""
    try:
        return max(0, (state / rangedfetch.DONE_NAME).read_bytes().count(b"\n") - 1)
    except FileNotFoundError:
        return 0


def files_under(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_pull_killed_at_half_resumes_and_fetches_only_the_chunks_it_lacks(
    server: S3Server, app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"resume-{uuid.uuid4().hex[:12]}"
    use_env(monkeypatch, server.env(prefix))
    data = payload(BLOB_BYTES)
    engine = engine_with_blob(app_ctx, tmp_path, data)
    sha256 = str(engine.sha256)
    serving_home, dest = tmp_path / "serving-home", tmp_path / "pulled"  # a host with no store folder
    state = rangedfetch.state_folder(dest / "tmp", sha256)

    proxy = GatedProxy(server.port)
    try:
        proxy.hold_responses_after(BLOB_BYTES // 2)
        env = server.env(prefix, endpoint=proxy.endpoint, ENGINECACHE_STORE_CONCURRENCY=str(CONCURRENCY))
        killed = pull_process(app_ctx, serving_home, dest, int(engine.id or 0), env)
        try:
            assert proxy.holding.wait(BOUND), "the download never reached half"
            # Half the object went through; all but the ranges in flight (one per connection) landed.
            landed = (BLOB_BYTES // 2 - HEADER_SLACK) // CHUNK - CONCURRENCY
            wait_for(lambda: recorded_chunks(state) >= landed, f"{landed} chunks recorded", BOUND)
            assert killed.poll() is None, killed.communicate()
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.communicate(timeout=BOUND)
        first = proxy.received
    finally:
        proxy.close()
    assert killed.returncode == -signal.SIGKILL
    assert first <= BLOB_BYTES // 2
    left = files_under(dest)
    assert {f for f in left if not f.startswith(f"tmp/{state.name}/") and f != "gc.lock"} == set(), left
    assert not blob_path(dest, sha256).exists() and not manifest_path(dest, "mlp").exists()

    counting = GatedProxy(server.port)
    try:
        env = server.env(prefix, endpoint=counting.endpoint, ENGINECACHE_STORE_CONCURRENCY=str(CONCURRENCY))
        resumed = pull_process(app_ctx, serving_home, dest, int(engine.id or 0), env)
        out, err = resumed.communicate(timeout=BOUND)
        again = counting.received
    finally:
        counting.close()
    assert resumed.returncode == 0, err
    assert again <= 0.6 * BLOB_BYTES, f"the resumed pull transferred {again} bytes of {BLOB_BYTES}"
    result = json.loads(out)
    assert 0 < result["copied_bytes"] <= 0.6 * BLOB_BYTES and result["copied_bytes"] <= again
    blob = blob_path(dest, sha256)
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == sha256
    assert not blob.stat().st_mode & 0o222, "read-only"
    assert list((dest / "tmp").iterdir()) == [], "the resume state is removed once the blob is in place"


def test_a_flipped_byte_in_the_bucket_is_named_by_chunk_and_range(
    server: S3Server, app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = f"flip-{uuid.uuid4().hex[:12]}"
    use_env(monkeypatch, server.env(prefix, ENGINECACHE_STORE_CONCURRENCY=str(CONCURRENCY)))
    data = payload(BLOB_BYTES)
    engine = engine_with_blob(app_ctx, tmp_path, data)
    sha256 = str(engine.sha256)
    wrong = bytearray(data)
    wrong[5 * CHUNK + 1234] ^= 0x01
    raw = S3Store(
        BUCKET,
        prefix=prefix,
        endpoint=server.endpoint,
        region=REGION,
        access_key_id=server.access_key,
        secret_access_key=server.secret_key,
        client_options={"allow_http": True},
    )
    obstore.put(raw, blob_key(sha256), bytes(wrong), attributes={"sha256": sha256})
    serving = AppContext.from_settings(tmp_path / "serving-home", app_ctx.db_url)
    dest = tmp_path / "pulled"
    try:
        with pytest.raises(IntegrityCheckError, match=rf"chunk 5 \(bytes {5 * CHUNK}-{6 * CHUNK - 1}\)"):
            pull(serving, "mlp", dest, wanted=Wanted(engine_id=engine.id))
    finally:
        serving.close()
    assert not blob_path(dest, sha256).exists() and not manifest_path(dest, "mlp").exists()
    assert list((dest / "tmp").iterdir()) == [], "wrong bytes leave no resume state"


def test_a_recorded_chunk_damaged_on_disk_is_fetched_again(tmp_path: Path) -> None:
    data = payload(4 * MIB)
    chunks = decode(chunk_list(data))
    assert chunks is not None
    sha256 = hashlib.sha256(data).hexdigest()
    reads: list[int] = []

    def read_range(start: int, end: int) -> memoryview:
        reads.append(start // CHUNK)
        if len(reads) > 3:
            raise StoreError("the connection was cut")
        return memoryview(data[start:end])

    folder = rangedfetch.state_folder(tmp_path, sha256)
    fill = {"name": "blob", "sha256": sha256, "size": len(data), "chunks": chunks, "concurrency": 1}
    with rangedfetch.hold_state(folder) as state, pytest.raises(StoreError, match="cut"):
        state.fill(read_range, **fill)  # type: ignore[arg-type]
    assert recorded_chunks(folder) == 3
    with open(folder / rangedfetch.DATA_NAME, "r+b") as damaged:
        damaged.seek(CHUNK + 7)
        damaged.write(b"\xff")
    reads.clear()

    def whole(start: int, end: int) -> memoryview:
        reads.append(start // CHUNK)
        return memoryview(data[start:end])

    with rangedfetch.hold_state(folder) as state:
        got = state.fill(whole, **fill)  # type: ignore[arg-type]
        assert (folder / rangedfetch.DATA_NAME).read_bytes() == data
    assert sorted(reads) == [1, *range(3, len(data) // CHUNK)], "chunks 0 and 2 kept, 1 fetched again"
    assert (got.resumed_bytes, got.fetched_bytes) == (2 * CHUNK, len(data) - 2 * CHUNK)


def test_a_fetch_into_the_store_keeps_no_temp_file_outside_its_state(tmp_path: Path) -> None:
    source = ArtifactStore(tmp_path / "shared", remote=None)
    data = payload(3 * MIB + 5)
    info = source.write_blob([data])
    target = ArtifactStore(tmp_path / "home", remote=None)
    got = target.fetch(info.sha256, size=info.size, chunk_blake3=chunk_list(data), source=source)
    assert got.path.read_bytes() == data and got.fetched_bytes == len(data)
    assert list(target.tmp_dir.iterdir()) == []
    with pytest.raises(IntegrityCheckError, match="recorded 12"):
        ArtifactStore(tmp_path / "third", remote=None).fetch(info.sha256, size=12, source=source)


def test_gc_removes_a_resume_state_nobody_resumed_within_its_age(app_ctx: AppContext) -> None:
    tmp = app_ctx.store.tmp_dir
    data = payload(2 * MIB)

    def interrupted(name: str) -> Path:
        """A fetch that lost its source after two chunks: its state stays for the next one."""
        sha256 = hashlib.sha256(name.encode()).hexdigest()
        calls = iter(range(2))

        def read_range(start: int, end: int) -> memoryview:
            if next(calls, None) is None:
                raise StoreError("unreachable")
            return memoryview(data[start:end])

        folder = rangedfetch.state_folder(tmp, sha256)
        with rangedfetch.hold_state(folder) as state, pytest.raises(StoreError):
            state.fill(
                read_range, name=name, sha256=sha256, size=len(data), chunks=None, concurrency=1, chunk_bytes=CHUNK
            )
        return folder

    stale, young, held = interrupted("stale"), interrupted("young"), interrupted("held")
    set_age(stale, 2 * DAY)
    set_age(held, 2 * DAY)
    set_age(young, 2 * HOUR)  # older than the temp age, younger than the resume age
    clock = FakeClock()
    with rangedfetch.hold_state(held):  # a fetch at work on it
        dry = run_gc(app_ctx, clock, apply=False)
        assert removed_paths(dry, RESUME_STATE) == {app_ctx.store.relative(stale)} and stale.is_dir()
        report = run_gc(app_ctx, clock, apply=True)
    assert removed_paths(report, RESUME_STATE) == {app_ctx.store.relative(stale)} and report.ok
    assert not stale.exists() and young.is_dir() and held.is_dir()
    kept = {k.path: k.reason for k in report.kept if k.kind == RESUME_STATE}
    assert "at work" in kept[app_ctx.store.relative(held)]
    assert "may resume" in kept[app_ctx.store.relative(young)]
    assert [e.name for e in tmp.iterdir() if e.name.startswith(".")] == [], "nothing left aside"
