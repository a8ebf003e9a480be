"""Exports: a Triton model repository checked against Triton's own schema, and the per-hardware tree."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import ExportError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import verify_engines
from enginecache.service.fleet.exports import export_model, render_triton_config, tree_targets, verify_tree
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.modelfactory import make_conv, make_mlp

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")


def _parse(path: Path) -> object:
    return text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())


@pytest.fixture
def app(app_ctx: AppContext, tmp_path: Path) -> AppContext:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    build_engine(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm86,sm89",)))
    build_engine(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm80",)))
    build_engine(app_ctx, BuildRequest(model="mlp", backend="ort"))
    return app_ctx


def test_triton_repository_for_tensorrt_plans(app: AppContext, tmp_path: Path) -> None:
    result = export_model(app, "mlp", tmp_path / "repo", fmt="triton")
    config = _parse(result.root / "config.pbtxt")
    assert config.name == "mlp"  # type: ignore[attr-defined]
    assert config.platform == "tensorrt_plan"  # type: ignore[attr-defined]
    assert config.max_batch_size == 8  # type: ignore[attr-defined]  # the profile's max batch
    assert dict(config.cc_model_filenames) == {  # type: ignore[attr-defined]
        "8.0": "model.sm80.plan",
        "8.6": "model.sm86_sm89.plan",
        "8.9": "model.sm86_sm89.plan",
    }
    assert config.default_model_filename == "model.sm80.plan"  # type: ignore[attr-defined]
    assert config.version_policy.latest.num_versions == 1  # type: ignore[attr-defined]
    (inp,) = config.input  # type: ignore[attr-defined]
    (out,) = config.output  # type: ignore[attr-defined]
    assert (inp.name, list(inp.dims), model_config_pb2.DataType.Name(inp.data_type)) == ("input", [16], "TYPE_FP32")
    assert (out.name, list(out.dims)) == ("output", [32])
    for name in ("model.sm80.plan", "model.sm86_sm89.plan"):
        assert (result.root / "1" / name).is_file()


def test_triton_repository_for_an_ort_engine(app: AppContext, tmp_path: Path) -> None:
    result = export_model(app, "mlp", tmp_path / "repo", fmt="triton", backend="ort")
    config = _parse(result.root / "config.pbtxt")
    assert (config.backend, config.platform) == ("onnxruntime", "onnxruntime_onnx")  # type: ignore[attr-defined]
    assert config.default_model_filename == "model.ort"  # type: ignore[attr-defined]
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_CPU"  # type: ignore[attr-defined]
    assert (result.root / "1" / "model.ort").read_bytes()[4:8] == b"ORTM"


def test_fixed_batch_model_gets_max_batch_size_zero_and_full_dims(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "fixed.onnx", batch_dim=4), name="fixed")
    engine = build_engine(app_ctx, BuildRequest(model="fixed", backend="rtx", targets=("sm86",))).engine
    text = render_triton_config("fixed", engine, default_file="model.plan", cc_files={"8.6": "model.plan"})
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [4, 16]


def _fake_engine(backend: str, io: list[dict[str, Any]], **fields: object) -> EngineRecord:
    """An engine row as a worker would record it (no build here)."""
    values: dict[str, object] = {
        "id": 1,
        "model_id": 1,
        "backend": backend,
        "backend_version": "10.13.0.35",
        "precision": "fp16",
        "targets": "sm86",
        "cache_key": "k" * 64,
        "status": EngineStatus.READY,
        "onnx_digest": "d" * 64,
        "os": "Linux",
        "target_info": {"compute_capability": "sm86", "gpu": "NVIDIA A10"},
        "build_options": {"profiles": {"input": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}},
        "io": io,
    }
    return EngineRecord(**{**values, **fields})


def test_a_tensorrt_engine_is_filed_by_gpu_and_served_as_a_plan_fake_gpu_build() -> None:
    """A TensorRT engine as an A10 worker records it (no TensorRT here): the tree names the GPU it
    was tuned on, Triton gets a plan on a GPU instance, keyed by its compute capability."""
    io = [
        {"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 16]},
        {"name": "output", "mode": "output", "dtype": "float32", "shape": [-1, 32]},
    ]
    engine = _fake_engine("trt", io)
    assert tree_targets(engine) == ["nvidia-a10-sm86"]
    text = render_triton_config("mlp", engine, default_file="model.sm86.plan", cc_files={"8.6": "model.sm86.plan"})
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert (config.platform, config.backend) == ("tensorrt_plan", "")
    assert dict(config.cc_model_filenames) == {"8.6": "model.sm86.plan"} and config.max_batch_size == 8
    assert model_config_pb2.ModelInstanceGroup.Kind.Name(config.instance_group[0].kind) == "KIND_GPU"


def test_triton_schema_rejects_a_mistyped_field() -> None:
    with pytest.raises(text_format.ParseError):
        text_format.Parse('name: "m"\nmax_batch_sizes: 8\n', model_config_pb2.ModelConfig())


def test_tree_export_with_manifest(app: AppContext, tmp_path: Path) -> None:
    result = export_model(app, "mlp", tmp_path / "tree", fmt="tree")
    names = sorted(p.name for p in result.root.iterdir())
    cpu = next(n for n in names if n.startswith("x86_64") or n.startswith("aarch64"))
    assert names == sorted(["manifest.json", "sm80.fp32.engine", "sm86.fp32.engine", "sm89.fp32.engine", cpu])
    manifest = json.loads((result.root / "manifest.json").read_text())
    assert manifest["model"] == "mlp" and len(manifest["engines"]) == 4
    for entry in manifest["engines"]:
        data = (result.root / entry["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(entry["fingerprint"]["cache_key"]) == 64
        assert entry["fingerprint"]["key_ingredients"]["onnx_digest"] == manifest["model_digest"]
    assert verify_tree(result.root) == []
    replaced = result.root / "sm80.fp32.engine"
    (result.root / "new.tmp").write_bytes(b"tampered")
    os.replace(result.root / "new.tmp", replaced)  # how files get changed: a new file breaks the link
    assert any("sm80.fp32.engine" in p for p in verify_tree(result.root))
    assert all(r.ok for r in verify_engines(app)), "replacing a tree file leaves the store intact"


def test_export_cli_and_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("ENGINECACHE_HOME", str(home))
    ctx = AppContext.from_settings(home)
    register_model(ctx, make_conv(tmp_path / "conv.onnx"), name="conv")
    none = run_cli(capsys, "export", str(tmp_path / "out"), "--model", "conv", "--format", "triton")
    assert none.code == 2 and "no READY engine" in none.err
    build_engine(ctx, BuildRequest(model="conv", backend="rtx", targets=("sm89",)))
    ok = run_cli(capsys, "export", str(tmp_path / "out"), "--model", "conv", "--format", "triton", "--json")
    assert ok.code == 0, ok.err
    assert (tmp_path / "out" / "conv" / "config.pbtxt").is_file()
    assert any("stock Triton" in w for w in ok.json()["warnings"])
    text = run_cli(capsys, "export", str(tmp_path / "text"), "--model", "conv", "--format", "triton")
    assert text.code == 0, text.err
    assert "warning: these are TensorRT-RTX plans: stock Triton" in text.out, "text mode says it too"
    bad = run_cli(capsys, "export", str(tmp_path / "out"), "--model", "conv", "--format", "zip")
    assert bad.code == 2 and "unknown export format" in bad.err
    with pytest.raises(ExportError):
        export_model(ctx, "conv", tmp_path / "x", fmt="tree", precision="int8")
    ctx.close()


# -- compute capabilities, output shapes, scalars, warnings -------------------------------------


def test_default_plan_is_the_lowest_compute_capability_by_number(app: AppContext, tmp_path: Path) -> None:
    """sm120 sorts before sm80 as text; Triton's default plan is the one for the lowest SM by number."""
    build_engine(app, BuildRequest(model="mlp", backend="rtx", targets=("sm120",)))
    result = export_model(app, "mlp", tmp_path / "repo", fmt="triton", backend="rtx")
    config = _parse(result.root / "config.pbtxt")
    assert config.default_model_filename == "model.sm80.plan"  # type: ignore[attr-defined]
    assert config.cc_model_filenames["12.0"] == "model.sm120.plan"  # type: ignore[attr-defined]
    keys = [line.split('"')[1] for line in result.files[0].read_text().splitlines() if "cc_model_filenames" in line]
    assert keys == ["8.0", "8.6", "8.9", "12.0"]


def _wrong_output_model(path: Path, declared: list[int | str]) -> Path:
    """`output = input[batch, 16] @ w[16, 32]`, whose output declares `declared` instead."""
    w = numpy_helper.from_array(np.ones((16, 32), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["input", "w"], ["output"])],
        "wrong_output",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, declared)],
        [w],
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


@pytest.mark.parametrize("declared", [[1, 10], [1, 32]], ids=["conflicting", "fixed-batch"])
def test_ort_export_writes_the_output_shape_the_engine_computes(
    app_ctx: AppContext, tmp_path: Path, declared: list[int | str]
) -> None:
    """A declared output shape that disagrees with the graph ([1, 10] for [batch, 32]), or pins a
    batch the graph does not ([1, 32]), is not what Triton is told: ONNX Runtime's own metadata keeps
    [1, 32], the exported config has what the engine returns."""
    register_model(app_ctx, _wrong_output_model(tmp_path / "wrong.onnx", declared), name="wrong")
    build_engine(app_ctx, BuildRequest(model="wrong", backend="ort"))
    result = export_model(app_ctx, "wrong", tmp_path / "repo", fmt="triton", backend="ort")
    config = _parse(result.root / "config.pbtxt")
    (out,) = config.output  # type: ignore[attr-defined]
    assert config.max_batch_size == 8 and list(out.dims) == [32]  # type: ignore[attr-defined]
    session = ort.InferenceSession(str(result.root / "1" / "model.ort"), providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"input": np.zeros((3, 16), np.float32)})
    assert got.shape == (3, *out.dims)


def test_a_scalar_input_is_dims_1_with_an_empty_reshape(app_ctx: AppContext, tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["input", "scale"], ["output"])],
        "scaled",
        [
            helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 4])],
    )
    path = tmp_path / "scaled.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    register_model(app_ctx, path, name="scaled")
    build_engine(app_ctx, BuildRequest(model="scaled", backend="ort"))
    config = _parse(export_model(app_ctx, "scaled", tmp_path / "repo", fmt="triton").root / "config.pbtxt")
    scale = next(t for t in config.input if t.name == "scale")  # type: ignore[attr-defined]
    assert config.max_batch_size == 0  # type: ignore[attr-defined]  # a scalar has no batch dim
    assert list(scale.dims) == [1] and scale.HasField("reshape") and list(scale.reshape.shape) == []


def test_a_batch_only_output_is_dims_1_with_an_empty_reshape() -> None:
    """`scores[batch]` once Triton owns the batch dim has no dims left: [1] reshaped to []."""
    io = [
        {"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 16]},
        {"name": "scores", "mode": "output", "dtype": "float32", "shape": [-1]},
    ]
    text = render_triton_config("m", _fake_engine("trt", io), default_file="model.plan", cc_files={"8.6": "model.plan"})
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    (scores,) = config.output
    assert config.max_batch_size == 8 and list(scores.dims) == [1] and scores.HasField("reshape")


def test_tensorrt_rtx_plans_come_with_a_warning_that_stock_triton_cannot_load_them(
    app: AppContext, tmp_path: Path
) -> None:
    rtx = export_model(app, "mlp", tmp_path / "rtx", fmt="triton", backend="rtx")
    (warning,) = rtx.warnings
    assert "TensorRT-RTX" in warning and "stock Triton" in warning
    assert rtx.manifest["warnings"] == [warning] and rtx.to_dict()["warnings"] == [warning]
    text = (rtx.root / "config.pbtxt").read_text()
    assert text.startswith(f"# WARNING: {warning}\n")
    assert _parse(rtx.root / "config.pbtxt").platform == "tensorrt_plan"  # type: ignore[attr-defined]
    ort_export = export_model(app, "mlp", tmp_path / "ort", fmt="triton", backend="ort")
    assert ort_export.warnings == () and ort_export.manifest["warnings"] == []
    io = [
        {"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 16]},
        {"name": "output", "mode": "output", "dtype": "float32", "shape": [-1, 32]},
    ]
    trt = render_triton_config("m", _fake_engine("trt", io), default_file="model.plan", cc_files={"8.6": "model.plan"})
    assert "WARNING" not in trt  # TensorRT's plans are what stock Triton serves


# -- the tree: one file per engine ----------------------------------------------------------------


def _inode(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return (stat.st_dev, stat.st_ino)


def _blobs(app: AppContext) -> dict[str, Path]:
    """Each READY engine's blob by its targets ("sm86,sm89")."""
    from sqlmodel import select

    with app.catalog.read() as session:
        rows = session.exec(select(EngineRecord).where(EngineRecord.status == EngineStatus.READY)).all()
    return {row.targets: app.home / (row.blob_path or "") for row in rows}


def test_tree_hard_links_the_stores_blob_under_every_target(app: AppContext, tmp_path: Path) -> None:
    result = export_model(app, "mlp", tmp_path / "tree", fmt="tree", backend="rtx")
    blobs = _blobs(app)
    assert _inode(result.root / "sm86.fp32.engine") == _inode(result.root / "sm89.fp32.engine")
    assert _inode(result.root / "sm86.fp32.engine") == _inode(blobs["sm86,sm89"])
    assert _inode(result.root / "sm80.fp32.engine") == _inode(blobs["sm80"])
    assert verify_tree(result.root) == []
    again = export_model(app, "mlp", tmp_path / "tree", fmt="tree", backend="rtx")  # re-export in place
    assert _inode(again.root / "sm89.fp32.engine") == _inode(blobs["sm86,sm89"])
    assert sorted(p.name for p in again.root.iterdir()) == sorted(p.name for p in again.files)
    # The price of sharing: an in-place write reaches the store, where verify reports it.
    with open(again.root / "sm80.fp32.engine", "r+b") as stream:
        stream.write(b"X")
    assert not all(r.ok for r in verify_engines(app))


def test_tree_copies_once_per_engine_across_filesystems(
    app: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link
    objects = app.home / "objects"

    def link(source: os.PathLike[str], dest: os.PathLike[str]) -> None:
        if Path(source).is_relative_to(objects):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real_link(source, dest)

    monkeypatch.setattr(os, "link", link)
    result = export_model(app, "mlp", tmp_path / "tree", fmt="tree", backend="rtx")
    sm86, sm89 = result.root / "sm86.fp32.engine", result.root / "sm89.fp32.engine"
    assert _inode(sm86) == _inode(sm89) != _inode(_blobs(app)["sm86,sm89"])
    assert sm86.read_bytes() == _blobs(app)["sm86,sm89"].read_bytes()
    assert verify_tree(result.root) == []


@pytest.mark.slow
@pytest.mark.parametrize("legacy_name", ["..", "."])
@pytest.mark.parametrize("fmt", ["tree", "triton"])
def test_an_export_never_writes_outside_dest_even_for_a_legacy_name(
    app: AppContext, tmp_path: Path, legacy_name: str, fmt: str
) -> None:
    """Names are constrained at registration now; a catalog from before may still hold `..`."""
    from sqlmodel import select as select_rows

    from enginecache.db.models import ModelRecord

    with app.catalog.write() as session:
        model = session.exec(select_rows(ModelRecord).where(ModelRecord.name == "mlp")).one()
        model.name = legacy_name
        session.add(model)
    dest = tmp_path / "out" / "dest"
    with pytest.raises(ExportError, match="would write outside"):
        export_model(app, str(model.id), dest, fmt=fmt)
    assert not any((tmp_path / "out").rglob("*.plan")) and not any((tmp_path / "out").rglob("*.engine"))
    assert not (tmp_path / "out" / "config.pbtxt").exists()


def test_a_legacy_name_with_separators_is_exported_under_dest(app: AppContext, tmp_path: Path) -> None:
    from sqlmodel import select as select_rows

    from enginecache.db.models import ModelRecord

    with app.catalog.write() as session:
        model = session.exec(select_rows(ModelRecord).where(ModelRecord.name == "mlp")).one()
        model.name = "../../escape"
        session.add(model)
    dest = tmp_path / "out" / "dest"
    result = export_model(app, str(model.id), dest, fmt="tree")
    assert all(path.resolve().is_relative_to(dest.resolve()) for path in result.files)
