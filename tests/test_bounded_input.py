"""Bounded input: external data offsets and lengths checked at `model add`; archives limited in
entries, bytes and compression ratio while they stream, duplicate and case-colliding members
refused; deterministic build failures FAILED at once, the host's (the store) retried; a full disk
is "unavailable" (exit 3), never "bad input", and leaves nothing behind.

The full disks are real: a 1 MiB tmpfs mounted for the test (root only; skipped with the reason
elsewhere, failing under CI=true). The read-only store is a read-only bind mount of its objects.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import onnx
import pytest
from sqlmodel import select

from enginecache.core import onnx_graph
from enginecache.dashboard.uploads import (
    MAX_ARCHIVE_ENTRIES,
    MAX_COMPRESSION_RATIO,
    UploadedFile,
    extract_archive,
    stage_upload,
)
from enginecache.db import queue
from enginecache.db.models import EngineRecord, JobStatus, ModelRecord
from enginecache.errors import ExternalDataError, StoreError, UploadError
from enginecache.service.builds import BuildRequest
from enginecache.service.context import DB_URL_ENV, AppContext
from enginecache.service.jobs import submit_build
from enginecache.service.models import register_model
from enginecache.service.worker import Worker, WorkerConfig
from tests.clirunner import run_cli
from tests.conftest import files_under, skip_or_fail
from tests.dashboardkit import serve_home, view
from tests.modelfactory import make_external_data_model, make_mlp, save_unchecked
from tests.test_dashboard_views import plain

GIB = 1 << 30


# -- helpers ------------------------------------------------------------------------------------


def external_model(folder: Path, tensor: str = "w1", **entries: str | None) -> Path:
    """The 64x64 MLP with external data (`ext.onnx` + `ext.onnx.data`, 33,024 bytes: w1 at 0,
    16,384 bytes; b1 at 16,384, 256; w2 at 16,640, 16,384), `tensor`'s entries set (None removes one)."""
    path = make_external_data_model(folder)
    model = onnx.load(str(path), load_external_data=False)
    target = next(t for t in model.graph.initializer if t.name == tensor)
    info = {e.key: e.value for e in target.external_data}
    for key, value in entries.items():
        if value is None:
            info.pop(key, None)
        else:
            info[key] = value
    del target.external_data[:]
    for key, value in info.items():
        entry = target.external_data.add()
        entry.key, entry.value = key, value
    return save_unchecked(model, path)


def nothing_stored(app: AppContext) -> bool:
    with app.catalog.read() as session:
        none_recorded = session.exec(select(ModelRecord)).first() is None
    return none_recorded and files_under(app.home / "models") == [] and files_under(app.home / "tmp") == []


def engine_rows(app: AppContext) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(EngineRecord)).all())


def run_job(app: AppContext, job_id: int) -> None:
    """A worker for this one job until it is finished, retrying at once (no backoff to wait through)."""
    Worker(app, WorkerConfig(name="w", job_id=job_id, backoff_base_seconds=0.0, backoff_max_seconds=0.0)).run()


def _mount(*args: str) -> None:
    if shutil.which("mount") is None:
        skip_or_fail("no mount command on this host")
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        skip_or_fail(f"mount {' '.join(args)} is not permitted here: {done.stderr.strip()}")


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB filesystem (tmpfs), unmounted after the test."""
    where = tmp_path / "small"
    where.mkdir()
    _mount("-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(fs: Path, leave: int = 0) -> None:
    """Fill the filesystem at `fs` up to `leave` free bytes."""
    st = os.statvfs(fs)
    with open(fs / "filler", "wb") as out:
        out.write(bytes(max(0, st.f_bavail * st.f_frsize - leave)))


def tar_of(members: list[tuple[str, bytes | None]], mode: str = "w") -> bytes:
    """A tar (`mode` "w", "w:gz", ...) of files (bytes) and folders (None), in this order."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as archive:
        for name, payload in members:
            info = tarfile.TarInfo(name)
            if payload is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(payload)
                archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def zip_of(members: list[tuple[str, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, payload in members:
            archive.writestr(name, payload)
    return buffer.getvalue()


def upload(name: str, content: bytes) -> UploadedFile:
    return UploadedFile(name, io.BytesIO(content), len(content))


def assert_nothing_extracted(dest: Path) -> None:
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == [], "a staging folder was left behind"


# -- external data offsets and lengths at `model add` -----------------------------------------------


@pytest.mark.parametrize(
    ("entries", "shown"),
    [
        ({"offset": "-1000"}, "offset '-1000'"),
        ({"length": "-5"}, "length '-5'"),
        ({"offset": str(10**12), "length": None}, f"offset {10**12}"),
        ({"offset": "1.5"}, "offset '1.5'"),
        ({"length": "0x40"}, "length '0x40'"),
        ({"offset": "30000"}, "offset 30000"),  # 30,000 + 16,384 > 33,024
        ({"length": "8"}, "length 8"),  # w1 (float32 64x64) needs 16,384
        ({"length": "20000"}, "length 20000"),
    ],
)
def test_bad_offsets_and_lengths_are_refused_at_model_add(
    app_ctx: AppContext, tmp_path: Path, entries: dict[str, str | None], shown: str
) -> None:
    path = external_model(tmp_path / "m", **entries)
    with pytest.raises(ExternalDataError) as exc:
        register_model(app_ctx, path)
    message = str(exc.value)
    assert "'w1'" in message and "'ext.onnx.data'" in message and shown in message, message
    assert nothing_stored(app_ctx)


def test_cli_model_add_of_a_negative_offset_exits_2_and_stores_nothing(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = external_model(tmp_path / "m", offset="-1000")
    result = run_cli(capsys, "--home", str(app_ctx.home), "model", "add", str(path))
    assert result.code == 2, result.err
    assert "tensor 'w1'" in result.err and "offset '-1000'" in result.err
    assert nothing_stored(app_ctx)


def test_offsets_and_lengths_that_fit_are_accepted(app_ctx: AppContext, tmp_path: Path) -> None:
    """The last tensor without a length reads to the end of the file: exactly the bytes it needs."""
    path = external_model(tmp_path / "m", tensor="w2", length=None)
    assert register_model(app_ctx, path).created


# -- deterministic and transient build failures ----------------------------------------------------


def test_a_model_registered_before_offsets_were_checked_fails_its_build_once(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1 says 8 bytes where its dims need 16,384: the fp16 conversion fails on it the same way on
    every attempt (before this check, DEAD after 3 attempts and 3 FAILED engine rows). The catalog
    is made as `model add` made it before it checked lengths; the worker's children run the real
    checks."""
    path = external_model(tmp_path / "m", length="8")
    with monkeypatch.context() as before:
        before.setattr(onnx_graph, "_extent_problem", lambda *_args: None)
        register_model(app_ctx, path, name="old")
    request = BuildRequest(model="old", backend="ort", targets=("cpu",), precision="fp16")
    job = submit_build(app_ctx, request).job
    assert job is not None
    run_job(app_ctx, job.id or 0)
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.FAILED and done.attempts == 1, (done.status, done.attempts, done.error)
    error = done.error or ""
    assert "'w1'" in error and "'ext.onnx.data'" in error and "length 8" in error, error
    assert engine_rows(app_ctx) == [], "refused before a build started"


def test_external_data_made_bad_after_registration_fails_the_build_once(app_ctx: AppContext, tmp_path: Path) -> None:
    """The stored model's w1 offset rewritten to -1000 after `model add`: the stored bundle is no
    longer what was registered, which the build's own integrity check names (the model CORRUPT);
    either way one attempt, FAILED, never retried."""
    registered = register_model(app_ctx, external_model(tmp_path / "m"), name="ext").model
    stored = app_ctx.home / registered.store_path
    stored.chmod(0o644)
    external_model(tmp_path / "bad", offset="-1000")  # the same model, w1 at offset -1000
    shutil.copyfile(tmp_path / "bad" / "ext.onnx", stored)
    job = submit_build(app_ctx, BuildRequest(model="ext", backend="ort", targets=("cpu",), precision="fp32")).job
    assert job is not None
    run_job(app_ctx, job.id or 0)
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.FAILED and done.attempts == 1, (done.status, done.attempts, done.error)
    assert [row.status for row in engine_rows(app_ctx)] == ["FAILED"], "left to the build, which names it"


def test_a_store_that_cannot_be_written_is_retried_not_failed(app_ctx: AppContext, tmp_path: Path) -> None:
    """The engine blob cannot be published (objects/ became read-only, as a filesystem remounted
    read-only after errors is): StoreError, the host's problem, so each attempt is retried until the
    job is DEAD; never FAILED as if the request were at fault."""
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    objects = app_ctx.home / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    _mount("--bind", str(objects), str(objects))
    try:
        _mount("-o", "remount,ro,bind", str(objects))
        request = BuildRequest(model="mlp", backend="ort", targets=("cpu",), precision="fp32")
        job = submit_build(app_ctx, request, max_attempts=2).job
        assert job is not None
        run_job(app_ctx, job.id or 0)
    finally:
        subprocess.run(["umount", str(objects)], check=True)
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.DEAD and done.attempts == 2, (done.status, done.attempts, done.error)
    assert "could not write blob" in (done.error or "") and "Read-only file system" in (done.error or ""), done.error
    assert [row.status for row in engine_rows(app_ctx)] == ["FAILED", "FAILED"]


# -- a full disk: unavailable (exit 3), nothing left behind ---------------------------------------


def test_cli_model_add_on_a_full_store_exits_3(
    small_fs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A guard: the store's own writes already say StoreError (this passed before the work too)."""
    model = make_mlp(tmp_path / "big" / "mlp.onnx", features=512, hidden=512)  # 2 MiB, the store has 1
    catalog = f"sqlite:///{tmp_path / 'catalog.db'}"
    home = small_fs / "home"
    result = run_cli(capsys, "--home", str(home), "--db", catalog, "model", "add", str(model))
    assert result.code == 3, result.err
    assert "No space left on device" in result.err
    assert files_under(home / "tmp") == [] and files_under(home / "models") == []


def test_an_archive_extracted_onto_a_full_disk_is_a_store_error_and_leaves_nothing(
    small_fs: Path, tmp_path: Path
) -> None:
    model = make_mlp(tmp_path / "mlp.onnx", features=512, hidden=512).read_bytes()
    archive = tar_of([("folder/", None), ("folder/mlp.onnx", model)], mode="w:gz")
    dest = small_fs / "staging" / "upload"
    with pytest.raises(StoreError) as exc:
        extract_archive(upload("model.tar.gz", archive), dest, max_extract_bytes=GIB)
    assert "'folder/mlp.onnx'" in str(exc.value) and "No space left on device" in str(exc.value)
    assert_nothing_extracted(dest)


def test_a_dashboard_upload_onto_a_full_store_says_unavailable_not_rejected(
    small_fs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = small_fs / "home"
    serve_home(home, monkeypatch)
    monkeypatch.setenv(DB_URL_ENV, f"sqlite:///{tmp_path / 'catalog.db'}")  # the store is full, not the catalog
    model = make_mlp(tmp_path / "mlp.onnx", features=512, hidden=512)
    at = view("models").run()
    at.get("file_uploader")[0].upload("mlp.onnx", model.read_bytes()).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    assert len(at.error) == 1
    shown = plain(at.error[0].value)
    assert "upload rejected" not in shown and "try again later" in shown and "No space left on device" in shown
    assert files_under(home / "tmp") == [] and files_under(home / "models") == []
    app = AppContext.from_settings(home, f"sqlite:///{tmp_path / 'catalog.db'}")
    try:
        with app.catalog.read() as session:
            assert session.exec(select(ModelRecord)).first() is None
    finally:
        app.close()


# -- archives: entries, bytes and ratio counted while streaming ---------------------------------------


def test_a_tar_with_more_entries_than_the_limit_is_refused_as_it_streams(tmp_path: Path) -> None:
    archive = tar_of([(f"e{i}", b"") for i in range(MAX_ARCHIVE_ENTRIES + 1)])
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"more than 10,000 entries \(the entry limit\)") as exc:
        extract_archive(upload("many.tar", archive), dest, max_extract_bytes=GIB)
    assert f"'e{MAX_ARCHIVE_ENTRIES}'" in str(exc.value)
    assert_nothing_extracted(dest)


def test_a_zip_with_more_entries_than_the_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    archive = zip_of([(f"e{i}", b"") for i in range(MAX_ARCHIVE_ENTRIES + 1)])
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"more than 10,000 entries \(the entry limit\)") as exc:
        extract_archive(upload("many.zip", archive), dest, max_extract_bytes=GIB)
    assert f"'e{MAX_ARCHIVE_ENTRIES}'" in str(exc.value)
    assert_nothing_extracted(dest)


def test_a_zip_central_directory_too_big_for_the_entry_limit_is_refused_unparsed(tmp_path: Path) -> None:
    """zipfile parses the whole central directory before the first member: it is bounded by its size
    first (10,001 entries are far more than a limit of 100 could need)."""
    archive = zip_of([(f"e{i}", b"") for i in range(MAX_ARCHIVE_ENTRIES + 1)])
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"central directory is [\d,]+ bytes, more than 100 entries"):
        extract_archive(upload("many.zip", archive), dest, max_extract_bytes=GIB, max_entries=100)
    assert_nothing_extracted(dest)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A tar.bz2 of one 1 GiB member of zeros: 859 bytes (under the 8 GiB extract limit)."""
    import bz2

    compressor = bz2.BZ2Compressor(9)
    header = tarfile.TarInfo("model/weights.data")
    header.size = GIB
    parts = [compressor.compress(header.tobuf())]
    zeros = bytes(1 << 20)
    parts += [compressor.compress(zeros) for _ in range(GIB >> 20)]
    parts += [compressor.compress(bytes(2 * tarfile.BLOCKSIZE)), compressor.flush()]
    return b"".join(parts)


def test_a_decompression_bomb_under_the_size_limit_is_refused_by_its_ratio(tmp_path: Path, bomb: bytes) -> None:
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError) as exc:
        extract_archive(upload("bomb.tar.bz2", bomb), dest, max_extract_bytes=8 * GIB)
    message = str(exc.value)
    assert f"past {MAX_COMPRESSION_RATIO} times its own {len(bomb):,d} bytes (the compression ratio limit)" in message
    assert "'model/weights.data'" in message
    assert_nothing_extracted(dest)


def test_a_zip_member_compressed_with_bzip2_is_refused(tmp_path: Path) -> None:
    """zipfile decompresses a bzip2 member's bytes unbounded: 4 KiB of it can be gigabytes in memory."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_BZIP2) as archive:
        archive.writestr("model/weights.data", bytes(1 << 20))
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(
        UploadError, match=r"'model/weights\.data' uses compression method 12; only stored and deflated"
    ):
        extract_archive(upload("model.zip", buffer.getvalue()), dest, max_extract_bytes=GIB)
    assert_nothing_extracted(dest)


def test_the_byte_limit_counts_what_comes_out_and_names_the_member(tmp_path: Path) -> None:
    archive = tar_of([("m/a.bin", bytes(1000)), ("m/b.bin", bytes(1000)), ("m/c.bin", bytes(1000))], mode="w:gz")
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"expands past the limit of 2,500 bytes .* at member 'm/c\.bin'"):
        extract_archive(upload("model.tar.gz", archive), dest, max_extract_bytes=2500)
    assert_nothing_extracted(dest)


# -- archives: duplicate and colliding members ---------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "reason"),
    [
        (["m/a.onnx", "m/a.onnx"], "'m/a.onnx' appears twice (duplicate members)"),
        (["m/a.onnx", "./m/a.onnx"], "'./m/a.onnx' appears twice (duplicate members)"),
        (["a.onnx", "A.onnx"], "'A.onnx' names 'A.onnx', which differs from 'a.onnx' only in case"),
        (["x/y", "X/y"], "'X/y' names 'X', which differs from 'x' only in case"),
        (["caf\u00e9.data", "cafe\u0301.data"], "only in case (or Unicode normalisation)"),
        (["x", "x/y"], "'x/y' is inside 'x', which is a file"),
        (["x/y", "x"], "'x' names both a file and a folder"),
    ],
)
@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_duplicate_and_colliding_members_are_refused(tmp_path: Path, names: list[str], reason: str, kind: str) -> None:
    members = [(name, f"payload {i}".encode()) for i, name in enumerate(names)]
    if kind == "tar":
        archive, filename = tar_of(list(members)), "model.tar"
    else:
        duplicate = names[0] == names[1]
        with pytest.warns(UserWarning, match="Duplicate name") if duplicate else contextlib.nullcontext():
            archive, filename = zip_of(members), "model.zip"
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError) as exc:
        extract_archive(upload(filename, archive), dest, max_extract_bytes=GIB)
    assert reason in str(exc.value)
    assert_nothing_extracted(dest)


def test_archives_with_a_top_folder_entry_still_register(app_ctx: AppContext, tmp_path: Path) -> None:
    """`tar -C folder -czf model.tar.gz .` writes "." and "./..." members: the folder itself, fine."""
    source = make_external_data_model(tmp_path / "src")
    data = (source.parent / "ext.onnx.data").read_bytes()
    archive = tar_of([(".", None), ("./ext.onnx", source.read_bytes()), ("./ext.onnx.data", data)], mode="w:gz")
    model = stage_upload([upload("model.tar.gz", archive)], tmp_path / "staging" / "upload", max_extract_bytes=GIB)
    assert model == tmp_path / "staging" / "upload" / "ext.onnx"
    assert register_model(app_ctx, model).created


def test_the_dashboard_refuses_a_bomb_and_stores_nothing(
    app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch, bomb: bytes
) -> None:
    serve_home(app_ctx.home, monkeypatch)
    at = view("models").run()
    at.get("file_uploader")[0].upload("bomb.tar.bz2", bomb).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    assert len(at.error) == 1
    shown = plain(at.error[0].value)
    assert "upload rejected" in shown and "the compression ratio limit" in shown and "'model/weights.data'" in shown
    assert nothing_stored(app_ctx)
