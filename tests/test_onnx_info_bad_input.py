"""core.onnx_info: every kind of bad input gets an InvalidModelError that names the file and the problem."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from enginecache.core.onnx_info import inspect_model
from enginecache.errors import ExternalDataError, InvalidModelError
from tests.modelfactory import make_mlp, save_unchecked


def test_missing_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.onnx"
    with pytest.raises(InvalidModelError, match=r"not a file.*does not exist") as exc:
        inspect_model(path)
    assert str(path) in str(exc.value)


def test_directory(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match=r"not a file.*directory") as exc:
        inspect_model(tmp_path)
    assert str(tmp_path) in str(exc.value)


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.onnx"
    path.write_bytes(b"")
    with pytest.raises(InvalidModelError, match=r"is empty \(0 bytes\)") as exc:
        inspect_model(path)
    assert str(path) in str(exc.value)


@pytest.mark.parametrize(
    "content",
    [
        b"hello world, this is not a model\n",  # protobuf refuses it
        b"hi",  # protobuf "parses" it: an unknown varint field, no graph
        b"\x08\x00",  # parses: ir_version 0
        np.random.default_rng(0).bytes(4096),
    ],
    ids=["text", "text-that-parses", "ir0", "random"],
)
def test_not_onnx(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(content)
    with pytest.raises(InvalidModelError, match=r"is not an ONNX model") as exc:
        inspect_model(path)
    assert str(path) in str(exc.value)
    assert not isinstance(exc.value, ExternalDataError)


def test_parses_but_no_graph_says_what_is_missing(tmp_path: Path) -> None:
    path = tmp_path / "nograph.onnx"
    path.write_bytes(b"\x08\x08")  # ir_version 8 and nothing else
    with pytest.raises(InvalidModelError, match=r"no graph, no opset_import"):
        inspect_model(path)


def test_truncated_factory_model(tmp_path: Path) -> None:
    full = make_mlp(tmp_path / "full.onnx", features=64, hidden=64)
    data = full.read_bytes()
    path = tmp_path / "half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match=r"truncated or corrupt") as exc:
        inspect_model(path)
    assert str(path) in str(exc.value)
    assert "is not an ONNX model" not in str(exc.value)


def test_checker_rejection_carries_checker_message(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["undefined_tensor"], ["y"])],
        "broken",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = save_unchecked(model, tmp_path / "broken.onnx")
    with pytest.raises(InvalidModelError, match=r"onnx\.checker") as exc:
        inspect_model(path)
    assert "undefined_tensor" in str(exc.value)
    assert str(path) in str(exc.value)
