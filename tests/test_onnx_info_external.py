"""core.onnx_info: models with external data files (sizes, the bundle digest, unsafe locations)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import onnx
import pytest

from enginecache.core.onnx_info import inspect_model, model_digest, resolve_external_data
from enginecache.errors import ExternalDataError
from tests.modelfactory import file_sha256 as sha256
from tests.modelfactory import make_external_data_model, make_mlp, save_unchecked


def bundle_digest(model: Path, data_files: list[str]) -> str:
    """The documented bundle digest, recomputed independently of core.hashing."""
    text = "onnx-bundle-v1\n"
    text += f"{model.name}\t{model.stat().st_size}\t{sha256(model)}\n"
    for rel in sorted(data_files):
        f = model.parent / rel
        text += f"{rel}\t{f.stat().st_size}\t{sha256(f)}\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_external_data_files_size_and_bundle_digest(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    data = tmp_path / "m" / "ext.onnx.data"
    info = inspect_model(path)

    assert info.external_data_files == ("ext.onnx.data",)
    assert info.size_bytes == path.stat().st_size + data.stat().st_size
    assert info.parameter_count == 64 * 64 + 64 + 64 * 64
    assert info.parameter_bytes == 4 * info.parameter_count == data.stat().st_size
    assert info.digest == bundle_digest(path, ["ext.onnx.data"])
    assert info.digest != sha256(path)
    assert model_digest(path, ["ext.onnx.data"]) == info.digest


def test_several_external_files_sorted_and_deduplicated(tmp_path: Path) -> None:
    inline = make_mlp(tmp_path / "inline.onnx", features=8, hidden=8)
    model = onnx.load(str(inline))
    folder = tmp_path / "multi"
    folder.mkdir()
    onnx.save(
        model,
        str(folder / "m.onnx"),
        save_as_external_data=True,
        all_tensors_to_one_file=False,  # one file per tensor, named after it
        size_threshold=0,
    )
    # Point w2 at "./w1" too: same file spelled differently must appear once.
    proto = onnx.load(str(folder / "m.onnx"), load_external_data=False)
    for tensor in proto.graph.initializer:
        if tensor.name == "w2":
            for entry in tensor.external_data:
                if entry.key == "location":
                    entry.value = "./w1"
    save_unchecked(proto, folder / "m.onnx")
    (folder / "w2").unlink()

    info = inspect_model(folder / "m.onnx")
    assert info.external_data_files == ("b1", "w1")
    assert info.digest == bundle_digest(folder / "m.onnx", ["b1", "w1"])
    assert info.size_bytes == sum(f.stat().st_size for f in folder.iterdir())


def test_external_digest_changes_with_data_bytes(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    data = tmp_path / "m" / "ext.onnx.data"
    before = inspect_model(path).digest
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    data.write_bytes(bytes(raw))
    after = inspect_model(path).digest
    assert after != before
    assert after == bundle_digest(path, ["ext.onnx.data"])


def test_external_digest_stable_across_copies(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "elsewhere" / "b")
    copy = inspect_model(tmp_path / "elsewhere" / "b" / "ext.onnx")
    assert copy.digest == inspect_model(path).digest
    assert copy.external_data_files == ("ext.onnx.data",)


def test_inspect_never_loads_external_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_external_data_model(tmp_path / "m")

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("external data was loaded")

    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_model", forbidden)
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_tensor", forbidden)
    monkeypatch.setattr(onnx, "load_external_data_for_model", forbidden)
    assert inspect_model(path).parameter_count == 64 * 64 + 64 + 64 * 64


def test_resolve_external_data_returns_absolute_paths(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    (tmp_path / "m" / "sub").mkdir()
    (tmp_path / "m" / "sub" / "x.bin").write_bytes(b"x")
    got = resolve_external_data(path, ["ext.onnx.data", "./sub/x.bin"])
    assert got == [tmp_path / "m" / "ext.onnx.data", tmp_path / "m" / "sub" / "x.bin"]
    assert all(p.is_absolute() for p in got)


def rewrite_locations(path: Path, location: str, name: str = "bad.onnx") -> Path:
    """Copy the external-data model beside itself with every location set to `location`."""
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    return save_unchecked(model, path.parent / name)


@pytest.mark.parametrize(
    ("location", "problem"),
    [
        ("/etc/passwd", "absolute"),
        ("C:/weights.data", "absolute"),
        ("../outside.data", "'..'"),
        ("sub/../ext.onnx.data", "'..'"),
        ("sub\\ext.onnx.data", "backslash"),
        ("", "empty"),
    ],
)
def test_unsafe_external_location(tmp_path: Path, location: str, problem: str) -> None:
    path = make_external_data_model(tmp_path / "m")
    (tmp_path / "outside.data").write_bytes((tmp_path / "m" / "ext.onnx.data").read_bytes())
    (tmp_path / "m" / "sub").mkdir()
    bad = rewrite_locations(path, location)
    with pytest.raises(ExternalDataError) as exc:
        inspect_model(bad)
    message = str(exc.value)
    assert problem in message
    assert "'w1'" in message  # the first external tensor is named
    assert repr(location) in message
    assert str(bad) in message


def test_external_file_symlink_rejected(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    (tmp_path / "m" / "link.data").symlink_to(tmp_path / "m" / "ext.onnx.data")
    bad = rewrite_locations(path, "link.data")
    with pytest.raises(ExternalDataError, match=r"symlink") as exc:
        inspect_model(bad)
    assert "'w1'" in str(exc.value) and "'link.data'" in str(exc.value)


def test_external_parent_dir_symlink_rejected(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    (tmp_path / "real").mkdir()
    shutil.copy(tmp_path / "m" / "ext.onnx.data", tmp_path / "real" / "w.data")
    (tmp_path / "m" / "weights").symlink_to(tmp_path / "real", target_is_directory=True)
    bad = rewrite_locations(path, "weights/w.data")
    with pytest.raises(ExternalDataError, match=r"symlink.*weights"):
        inspect_model(bad)
    with pytest.raises(ExternalDataError, match=r"symlink"):
        resolve_external_data(bad, ["weights/w.data"])


def test_model_folder_behind_a_symlink_is_fine(tmp_path: Path) -> None:
    """Only links inside the model's folder are refused; the folder may itself be reached by one."""
    make_external_data_model(tmp_path / "real")
    (tmp_path / "alias").symlink_to(tmp_path / "real", target_is_directory=True)
    info = inspect_model(tmp_path / "alias" / "ext.onnx")
    assert info.external_data_files == ("ext.onnx.data",)


def test_missing_external_file(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    (tmp_path / "m" / "ext.onnx.data").unlink()
    with pytest.raises(ExternalDataError, match=r"missing") as exc:
        inspect_model(path)
    assert "ext.onnx.data" in str(exc.value) and "'w1'" in str(exc.value)
    with pytest.raises(ExternalDataError, match=r"missing"):
        model_digest(path, ["ext.onnx.data"])


def test_truncated_external_file(tmp_path: Path) -> None:
    path = make_external_data_model(tmp_path / "m")
    data = tmp_path / "m" / "ext.onnx.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(ExternalDataError, match=r"truncated") as exc:
        inspect_model(path)
    assert "'w1'" in str(exc.value)
