"""core.onnx_info: inspection without weights, the digest, and every kind of bad input."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginecache.core.onnx_info import (
    ModelInfo,
    TensorInfo,
    inspect_model,
    model_digest,
    resolve_external_data,
)
from enginecache.errors import ExternalDataError, InvalidModelError
from tests.conftest import shared_model
from tests.modelfactory import make_conv, make_external_data_model, make_mlp


def shared_sha256sums() -> dict[str, str]:
    sums = shared_model("SHA256SUMS").read_text().splitlines()
    return {line.split()[1]: line.split()[0] for line in sums if line.strip()}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save_unchecked(model: onnx.ModelProto, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())
    return path


# --------------------------------------------------------------------------------------------
# Factory models
# --------------------------------------------------------------------------------------------


def test_mlp_io_opset_producer_histogram_parameters(tmp_path: Path) -> None:
    path = make_mlp(tmp_path / "mlp.onnx", features=16, hidden=32)
    info = inspect_model(path)

    assert info.path == path
    assert info.inputs == (TensorInfo("input", "float32", ("batch", 16)),)
    assert info.outputs == (TensorInfo("output", "float32", ("batch", 32)),)
    assert info.inputs[0].is_dynamic
    assert info.ir_version == 8
    assert info.opsets == {"": 17}
    assert info.producer_name == "enginecache-tests"
    assert info.producer_version == ""
    assert info.graph_name == "mlp"
    assert info.op_histogram == {"MatMul": 2, "Add": 1, "Relu": 1}
    # w1 16x32 + b1 32 + w2 32x32, float32
    assert info.parameter_count == 16 * 32 + 32 + 32 * 32
    assert info.parameter_bytes == 4 * (16 * 32 + 32 + 32 * 32)
    assert info.external_data_files == ()
    assert info.size_bytes == path.stat().st_size
    assert info.digest == sha256(path)


def test_fixed_batch_is_not_dynamic_and_opset_is_read(tmp_path: Path) -> None:
    info = inspect_model(make_mlp(tmp_path / "mlp.onnx", batch_dim=4, opset=13))
    assert info.inputs[0].shape == (4, 16)
    assert not info.inputs[0].is_dynamic
    assert not info.outputs[0].is_dynamic
    assert info.opsets == {"": 13}


def test_conv_parameters_and_histogram(tmp_path: Path) -> None:
    info = inspect_model(make_conv(tmp_path / "conv.onnx"))
    assert info.inputs[0].shape == ("batch", 3, 32, 32)
    assert info.outputs[0].shape == ("batch", 10)
    assert info.parameter_count == 8 * 3 * 3 * 3 + 8 + 8 * 10
    assert info.parameter_bytes == 4 * info.parameter_count
    assert info.op_histogram == {
        "Conv": 1,
        "Relu": 1,
        "GlobalAveragePool": 1,
        "Flatten": 1,
        "MatMul": 1,
    }


def test_to_dict_is_json_safe(tmp_path: Path) -> None:
    info = inspect_model(make_mlp(tmp_path / "mlp.onnx"))
    data = json.loads(json.dumps(info.to_dict()))
    assert data["path"] == str(info.path)
    assert data["inputs"] == [{"name": "input", "dtype": "float32", "shape": ["batch", 16], "dynamic": True}]
    assert data["digest"] == info.digest
    assert data["op_histogram"] == {"MatMul": 2, "Add": 1, "Relu": 1}
    assert set(data) == {f for f in ModelInfo.__dataclass_fields__}


def test_different_weights_give_different_digests(tmp_path: Path) -> None:
    a = inspect_model(make_mlp(tmp_path / "a.onnx", seed=0))
    b = inspect_model(make_mlp(tmp_path / "b.onnx", seed=1))
    assert a.digest != b.digest
    assert a.parameter_count == b.parameter_count


# --------------------------------------------------------------------------------------------
# External data
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Shapes of real-world models
# --------------------------------------------------------------------------------------------


def test_ir3_opset9_initializers_listed_as_inputs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(3, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"])],
        "old",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("W", TensorProto.FLOAT, [4, 3]),
            helper.make_tensor_value_info("B", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 3
    onnx.checker.check_model(model)
    path = tmp_path / "old.onnx"
    onnx.save(model, str(path))

    info = inspect_model(path)
    assert [t.name for t in info.inputs] == ["x"]
    assert info.ir_version == 3
    assert info.opsets == {"": 9}
    assert info.parameter_count == 4 * 3 + 3


def test_if_subgraph_ops_counted(tmp_path: Path) -> None:
    then_graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["t0"]),
            helper.make_node("Neg", ["t0"], ["then_out"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, [2])],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Abs", ["x"], ["else_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, [2])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
            helper.make_node("Greater", ["s", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
        ],
        "with_if",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        initializer=[numpy_helper.from_array(np.array(0.0, np.float32), "zero")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = tmp_path / "if.onnx"
    onnx.save(model, str(path))

    info = inspect_model(path)
    assert info.op_histogram == {
        "ReduceSum": 1,
        "Greater": 1,
        "If": 1,
        "Relu": 1,
        "Neg": 1,
        "Abs": 1,
    }
    assert info.parameter_count == 1  # a scalar initializer counts one element
    assert info.parameter_bytes == 4


def test_custom_domain_ops_are_prefixed(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("MyOp", ["r"], ["y"], domain="com.example"),
        ],
        "custom",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("com.example", 1),
        ],
    )
    model.ir_version = 8
    path = save_unchecked(model, tmp_path / "custom.onnx")
    info = inspect_model(path)
    assert info.op_histogram == {"Relu": 1, "com.example:MyOp": 1}
    assert info.opsets == {"": 17, "com.example": 1}


def test_unknown_and_symbolic_dims(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [
            helper.make_node("Identity", ["x"], ["y"]),
            helper.make_node("Shape", ["x"], ["s"]),
        ],
        "dims",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [-1, None, "unk__214", "floor(h/2)", 7])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", -1, None, 3, 7]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [5]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = save_unchecked(model, tmp_path / "dims.onnx")
    info = inspect_model(path)

    x = info.inputs[0]
    assert x.dtype == "float16"
    assert x.shape == ("?", "?", "unk__214", "floor(h/2)", 7)
    assert x.is_dynamic
    y, s = info.outputs
    assert y.shape == ("batch", "?", "?", 3, 7)
    assert y.to_dict()["shape"] == ["batch", "?", "?", 3, 7]
    assert s == TensorInfo("s", "int64", (5,))
    assert not s.is_dynamic


def test_main_graph_output_without_shape_is_rejected(tmp_path: Path) -> None:
    """onnx.checker requires main-graph tensor IO to declare a shape (rank); unknown rank fails."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "norank",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = save_unchecked(model, tmp_path / "norank.onnx")
    with pytest.raises(InvalidModelError, match=r"onnx\.checker.*'shape'"):
        inspect_model(path)


@pytest.mark.parametrize(
    ("elem_type", "name"),
    [
        (TensorProto.INT32, "int32"),
        (TensorProto.BOOL, "bool"),
        (TensorProto.BFLOAT16, "bfloat16"),
        (TensorProto.FLOAT8E4M3FN, "float8_e4m3fn"),
        (TensorProto.STRING, "string"),
    ],
)
def test_dtype_names(tmp_path: Path, elem_type: int, name: str) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "dtype",
        [helper.make_tensor_value_info("x", elem_type, [3])],
        [helper.make_tensor_value_info("y", elem_type, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    info = inspect_model(save_unchecked(model, tmp_path / "dtype.onnx"))
    assert info.inputs[0].dtype == name


def test_sub_byte_parameter_bytes(tmp_path: Path) -> None:
    w = helper.make_tensor("w", TensorProto.INT4, [5], [1, 2, 3, -1, -2])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["y"])],
        "int4",
        [],
        [helper.make_tensor_value_info("y", TensorProto.INT4, [5])],
        initializer=[w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    info = inspect_model(save_unchecked(model, tmp_path / "int4.onnx"))
    assert info.parameter_count == 5
    assert info.parameter_bytes == 3  # five 4-bit values pack into three bytes


# --------------------------------------------------------------------------------------------
# Shared reference models
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------


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


def test_truncated_shared_model(tmp_path: Path) -> None:
    data = shared_model("resnet18.onnx").read_bytes()
    path = tmp_path / "resnet18_half.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidModelError, match=r"truncated or corrupt"):
        inspect_model(path)


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
