"""`enginecache model add/list/show` and `fingerprint` through the real entry point."""

from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest

from tests.clirunner import run_cli
from tests.modelfactory import make_external_data_model, make_mlp


def _home_args(tmp_path: Path) -> list[str]:
    return ["--home", str(tmp_path / "home")]


def _stored_models(tmp_path: Path) -> list[Path]:
    models = tmp_path / "home" / "models"
    return sorted(models.iterdir()) if models.is_dir() else []


def test_model_add_records_inspection_and_digest(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_mlp(tmp_path / "src" / "mlp.onnx")
    result = run_cli(capsys, *_home_args(tmp_path), "model", "add", str(path), "--name", "mlp", "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert data["created"] is True
    assert data["name"] == "mlp"
    assert data["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 16], "dynamic": True}]
    assert data["opsets"] == {"": 17}
    assert data["ir_version"] == 8
    assert data["op_histogram"] == {"MatMul": 2, "Add": 1, "Relu": 1}
    assert data["parameter_count"] == 16 * 32 + 32 + 32 * 32
    import hashlib

    assert data["digest"] == hashlib.sha256(path.read_bytes()).hexdigest()
    stored = tmp_path / "home" / data["store_path"]
    assert stored.read_bytes() == path.read_bytes()

    again = run_cli(capsys, *_home_args(tmp_path), "model", "add", str(path), "--json")
    assert again.code == 0
    assert again.json()["id"] == data["id"]
    assert again.json()["created"] is False

    listed = run_cli(capsys, *_home_args(tmp_path), "model", "list", "--json").json()
    assert [m["id"] for m in listed] == [data["id"]]
    shown = run_cli(capsys, *_home_args(tmp_path), "model", "show", "mlp", "--json").json()
    assert shown["digest"] == data["digest"]
    assert shown["outputs"][0]["shape"] == ["batch", 32]
    text = run_cli(capsys, *_home_args(tmp_path), "model", "show", "mlp").out
    assert "  input: float32 batch x 16" in text and "  output: float32 batch x 32" in text
    assert "ops: 2 MatMul, 1 Add, 1 Relu" in text and f"sha256 {data['digest']}" in text


def test_model_add_keeps_external_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_external_data_model(tmp_path / "src")
    result = run_cli(capsys, *_home_args(tmp_path), "model", "add", str(path), "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert data["external_data_files"] == ["ext.onnx.data"]
    stored = tmp_path / "home" / data["store_path"]
    assert (stored.parent / "ext.onnx.data").read_bytes() == (path.parent / "ext.onnx.data").read_bytes()
    onnx.checker.check_model(str(stored))  # the stored bundle resolves its external data


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _truncated(tmp_path: Path) -> Path:
    full = make_mlp(tmp_path / "full.onnx").read_bytes()
    target = tmp_path / "truncated.onnx"
    target.write_bytes(full[: len(full) // 2])
    return target


def _escaping(tmp_path: Path) -> Path:
    path = make_external_data_model(tmp_path / "escape" / "inner")
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = "../outside.data"
    shutil.copy(path.parent / "ext.onnx.data", tmp_path / "escape" / "outside.data")
    onnx.save(model, str(path))
    return path


def _absolute(tmp_path: Path) -> Path:
    path = make_external_data_model(tmp_path / "absolute")
    model = onnx.load(str(path), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = str(path.parent / "ext.onnx.data")
    onnx.save(model, str(path))
    return path


def _symlinked(tmp_path: Path) -> Path:
    path = make_external_data_model(tmp_path / "symlink")
    data = path.parent / "ext.onnx.data"
    real = tmp_path / "elsewhere.data"
    shutil.move(data, real)
    data.symlink_to(real)
    return path


def _missing(tmp_path: Path) -> Path:
    path = make_external_data_model(tmp_path / "missing")
    (path.parent / "ext.onnx.data").unlink()
    return path


BAD_INPUTS = {
    "not a file": (lambda tmp: tmp / "nope.onnx", "not a file"),
    "a directory": (lambda tmp: tmp, "not a file"),
    "zero bytes": (lambda tmp: _written(tmp / "empty.onnx", b""), "empty"),
    "not onnx": (lambda tmp: _written(tmp / "text.onnx", b"hello, I am not a model"), "not an ONNX model"),
    "truncated": (_truncated, "truncated"),
    "escaping external data": (_escaping, ".."),
    "absolute external data": (_absolute, "absolute"),
    "symlinked external data": (_symlinked, "symlink"),
    "missing external data": (_missing, "ext.onnx.data"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_model_add_rejects_bad_input_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    make, expected = BAD_INPUTS[case]
    path = make(tmp_path)
    result = run_cli(capsys, *_home_args(tmp_path), "model", "add", str(path))
    assert result.code == 2, (result.out, result.err)
    assert result.err.startswith("error: ")
    assert expected in result.err
    assert "Traceback" not in result.err
    assert _stored_models(tmp_path) == []
    listed = run_cli(capsys, *_home_args(tmp_path), "model", "list", "--json")
    assert listed.json() == []


def test_fingerprint_without_gpu_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(capsys, *_home_args(tmp_path), "fingerprint", "--json")
    assert result.code == 0, result.err
    data = result.json()
    assert data["os"] == "Linux"
    assert data["cpu_isa"], "ISA flags are listed"
    assert data["packages"]["tensorrt_rtx"].startswith("1.")
    assert data["packages"]["onnxruntime"]
    if not data["gpus"]:
        assert data["nvml"].startswith("unavailable")
    text = run_cli(capsys, *_home_args(tmp_path), "fingerprint")
    assert text.code == 0
    assert "gpus:" in text.out
