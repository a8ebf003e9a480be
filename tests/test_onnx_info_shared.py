"""core.onnx_info on the shared reference models (../shared/models)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.core.onnx_info import inspect_model
from enginecache.errors import InvalidModelError
from tests.conftest import shared_model

pytestmark = pytest.mark.shared


def shared_sha256sums() -> dict[str, str]:
    sums = shared_model("SHA256SUMS").read_text().splitlines()
    return {line.split()[1]: line.split()[0] for line in sums if line.strip()}


@pytest.mark.parametrize(
    "name",
    ["resnet18.onnx", "mobilenet_v3_small.onnx", "bert_mini.onnx", "tiny_llama.onnx"],
)
def test_shared_model_digest_matches_sha256sums(name: str) -> None:
    path = shared_model(name)
    info = inspect_model(path)
    assert info.digest == shared_sha256sums()[name]
    assert info.parameter_count > 0
    assert info.parameter_bytes == 4 * info.parameter_count  # all float32 weights
    assert info.opsets == {"": 17}
    assert info.producer_name == "pytorch"
    assert info.external_data_files == ()
    assert info.size_bytes == path.stat().st_size


def test_shared_resnet18_input() -> None:
    info = inspect_model(shared_model("resnet18.onnx"))
    assert len(info.inputs) == 1
    (x,) = info.inputs
    assert x.name == "input" and x.dtype == "float32"
    assert x.shape == ("batch", 3, 224, 224)
    assert x.is_dynamic
    assert info.outputs[0].shape == ("batch", 1000)
    assert info.op_histogram["Conv"] == 20
    assert info.parameter_count > 11_000_000


def test_shared_bert_mini_inputs() -> None:
    info = inspect_model(shared_model("bert_mini.onnx"))
    assert [(t.name, t.dtype, t.shape) for t in info.inputs] == [
        ("input_ids", "int64", ("batch", "seq")),
        ("attention_mask", "int64", ("batch", "seq")),
    ]
    assert info.outputs[0].shape == ("batch", "seq", 256)


def test_truncated_shared_model(tmp_path: Path) -> None:
    data = shared_model("resnet18.onnx").read_bytes()
    path = tmp_path / "resnet18_half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match=r"truncated or corrupt"):
        inspect_model(path)
