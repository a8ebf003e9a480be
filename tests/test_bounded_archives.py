"""Bounded input, archives: limited in entries, bytes and compression ratio while they stream;
duplicate and case-colliding members refused; a folder's own entry accepted; the dashboard refuses
a bomb and stores nothing."""

from __future__ import annotations

import contextlib
import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from enginecache.dashboard.uploads import (
    MAX_ARCHIVE_ENTRIES,
    MAX_COMPRESSION_RATIO,
    extract_archive,
    stage_upload,
)
from enginecache.errors import UploadError
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from tests.boundedkit import (
    GIB,
    assert_nothing_extracted,
    dashboard_upload_error,
    nothing_stored,
    tar_of,
    upload,
    zip_of,
)
from tests.dashboardkit import serve_home
from tests.modelfactory import make_external_data_model

# -- archives: entries, bytes and ratio counted while streaming -------------------------------


def _too_many_members() -> list[tuple[str, bytes]]:
    """One empty member past the entry limit: e0, e1, ..."""
    return [(f"e{i}", b"") for i in range(MAX_ARCHIVE_ENTRIES + 1)]


def _assert_refused_past_the_entry_limit(tmp_path: Path, filename: str, archive: bytes) -> None:
    """`archive` of `_too_many_members()` is refused at the entry limit, naming the first member
    past it, and leaves nothing extracted."""
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"more than 10,000 entries \(the entry limit\)") as exc:
        extract_archive(upload(filename, archive), dest, max_extract_bytes=GIB)
    assert f"'e{MAX_ARCHIVE_ENTRIES}'" in str(exc.value)
    assert_nothing_extracted(dest)


@pytest.mark.slow
def test_a_tar_with_more_entries_than_the_limit_is_refused_as_it_streams(tmp_path: Path) -> None:
    _assert_refused_past_the_entry_limit(tmp_path, "many.tar", tar_of(list(_too_many_members())))


def test_a_zip_with_more_entries_than_the_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    _assert_refused_past_the_entry_limit(tmp_path, "many.zip", zip_of(_too_many_members()))


def test_a_zip_central_directory_too_big_for_the_entry_limit_is_refused_unparsed(tmp_path: Path) -> None:
    """zipfile parses the whole central directory before the first member: it is bounded by its size
    first (10,001 entries are far more than a limit of 100 could need)."""
    archive = zip_of(_too_many_members())
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"central directory is [\d,]+ bytes, more than 100 entries"):
        extract_archive(upload("many.zip", archive), dest, max_extract_bytes=GIB, max_entries=100)
    assert_nothing_extracted(dest)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A tar.bz2 of one 64 MiB member of zeros: about 150 bytes, far under the 8 GiB extract
    limit, past the 16 MiB any archive may expand to, and far over the ratio limit."""
    import bz2

    size = 64 << 20
    compressor = bz2.BZ2Compressor(9)
    header = tarfile.TarInfo("model/weights.data")
    header.size = size
    parts = [compressor.compress(header.tobuf())]
    zeros = bytes(1 << 20)
    parts += [compressor.compress(zeros) for _ in range(size >> 20)]
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


# -- archives: duplicate and colliding members ------------------------------------------------


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
    shown = dashboard_upload_error("bomb.tar.bz2", bomb)
    assert "upload rejected" in shown and "the compression ratio limit" in shown and "'model/weights.data'" in shown
    assert nothing_stored(app_ctx)


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_member_nested_thousands_of_folders_deep_is_refused_as_an_upload_error(tmp_path: Path, kind: str) -> None:
    """A tar member 2,000 folders deep raised RecursionError (making its folders) instead of the
    upload's own error; the depth is checked with the member's name, before any folder is made."""
    members = [("/".join(["d"] * 2000) + "/m.onnx", b"x")]
    archive, filename = (tar_of(members), "deep.tar") if kind == "tar" else (zip_of(members), "deep.zip")
    dest = tmp_path / "staging" / "upload"
    with pytest.raises(UploadError, match=r"is 2001 folders deep \(at most 64\)"):
        extract_archive(upload(filename, archive), dest, max_extract_bytes=GIB)
    assert_nothing_extracted(dest)
