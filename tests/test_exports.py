"""Exports: a Triton model repository checked against Triton's own schema, and the per-hardware tree."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from google.protobuf import text_format

from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import ExportError
from enginecache.service.builds import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines import verify_engines
from enginecache.service.exports import export_model, render_triton_config, tree_targets, verify_tree
from enginecache.service.models import register_model
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


def test_a_tensorrt_engine_is_filed_by_gpu_and_served_as_a_plan_fake_gpu_build() -> None:
    """A TensorRT engine as an A10 worker records it (no TensorRT here): the tree names the GPU it
    was tuned on, Triton gets a plan on a GPU instance, keyed by its compute capability."""
    io = [
        {"name": "input", "mode": "input", "dtype": "float32", "shape": [-1, 16]},
        {"name": "output", "mode": "output", "dtype": "float32", "shape": [-1, 32]},
    ]
    engine = EngineRecord(
        id=1,
        model_id=1,
        backend="trt",
        backend_version="10.13.0.35",
        precision="fp16",
        targets="sm86",
        cache_key="k" * 64,
        status=EngineStatus.READY,
        onnx_digest="d" * 64,
        os="Linux",
        target_info={"compute_capability": "sm86", "gpu": "NVIDIA A10"},
        build_options={"profiles": {"input": {"min": [1, 16], "opt": [4, 16], "max": [8, 16]}}},
        io=io,
    )
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
    (result.root / "sm80.fp32.engine").write_bytes(b"tampered")
    assert any("sm80.fp32.engine" in p for p in verify_tree(result.root))
    assert all(r.ok for r in verify_engines(app)), "the export is a copy: editing it leaves the store intact"


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
    bad = run_cli(capsys, "export", str(tmp_path / "out"), "--model", "conv", "--format", "zip")
    assert bad.code == 2 and "unknown export format" in bad.err
    with pytest.raises(ExportError):
        export_model(ctx, "conv", tmp_path / "x", fmt="tree", precision="int8")
    ctx.close()
