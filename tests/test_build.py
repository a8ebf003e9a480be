"""Real builds with TensorRT-RTX (CPU-only AOT) and ONNX Runtime, through the service and CLI."""

from __future__ import annotations

import hashlib
from pathlib import Path

import blake3
import numpy as np
import onnx
import pytest
import sqlalchemy as sa

from enginecache.core.fingerprint import host_fingerprint
from enginecache.core.hashing import HEAD_BYTES
from enginecache.core.store import ArtifactStore
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import BuildFailedError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import check_engine, verify_engines
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.conftest import corrupt_blob, files_under
from tests.modelfactory import make_conv, make_mlp, quantize_with_ort


def _engines(app: AppContext) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(session.exec(sa.select(EngineRecord)).scalars())  # type: ignore[call-overload]


def _store_files(app: AppContext) -> dict[str, list[Path]]:
    """Every file in the store's blob and scratch folders (a leftover temp or staging file included)."""
    return {folder: files_under(app.home / folder) for folder in ("objects", "tmp")}


def _ready_blobs(app: AppContext) -> list[Path]:
    """Where the READY engines' blobs belong under objects/ (`sha256/<2 hex>/<digest>`)."""
    digests = {e.sha256 or "" for e in _engines(app) if e.status == EngineStatus.READY}
    return sorted(Path("sha256", digest[:2], digest) for digest in digests)


def test_rtx_build_records_everything_and_hits_on_repeat(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app = catalog_ctx
    model = register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    request = BuildRequest(model="mlp", backend="rtx", targets=("sm86,sm89",))
    first = build_engine(app, request)
    engine = first.engine
    assert first.cache_hit is False
    assert engine.status == EngineStatus.READY
    assert engine.targets == "sm86,sm89"
    blob = app.home / (engine.blob_path or "")
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == engine.sha256
    assert engine.size_bytes == blob.stat().st_size > 1000
    assert engine.build_seconds is not None and engine.build_seconds > 0
    assert engine.onnx_digest == model.digest
    ingredients = engine.key_ingredients
    assert ingredients["onnx_digest"] == model.digest
    assert ingredients["backend"] == "rtx"
    assert ingredients["backend_version"].startswith("1.7")
    assert ingredients["target"] == {"compute_capabilities": ["sm86", "sm89"]}
    assert ingredients["precision"]["name"] == "fp32"
    assert ingredients["build_options"]["profiles"] == {"input": {"min": [1, 16], "opt": [1, 16], "max": [8, 16]}}
    assert [(t["name"], t["mode"], t["dtype"]) for t in engine.io] == [
        ("input", "input", "float32"),
        ("output", "output", "float32"),
    ]
    assert "Building engine" in engine.builder_log or "[VERBOSE]" in engine.builder_log
    assert engine.created_at.tzinfo is not None

    second = build_engine(app, request)
    assert second.cache_hit is True
    assert second.engine.id == engine.id
    assert len(_engines(app)) == 1, "a hit builds nothing"

    other = build_engine(app, BuildRequest(model="mlp", backend="rtx", targets=("sm80",)))
    assert other.cache_hit is False
    assert other.engine.cache_key != engine.cache_key

    [result] = verify_engines(app, [engine.id or 0])
    assert result.ok
    blobs = _ready_blobs(app)
    assert len(blobs) == 2
    assert _store_files(app) == {"objects": blobs, "tmp": []}, "the blobs and nothing else: no temp or staging file"


def test_progress_phases_reach_the_callback(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="conv")
    events = []
    build_engine(app_ctx, BuildRequest(model="conv", backend="rtx", targets=("sm86",)), progress=events.append)
    starts = [(e.phase, e.parent, e.steps) for e in events if e.kind == "start"]
    top_phase, top_parent, top_steps = starts[0]
    assert (top_phase, top_parent) == ("Building engine", None) and top_steps
    assert ("Cloning network graph", "Building engine") in [(phase, parent) for phase, parent, _ in starts]
    assert all(parent is not None for _, parent, _ in starts[1:]), "every later phase sits under another"
    assert any(e.kind == "step" and e.phase == "Building engine" for e in events)
    assert events[-1].kind == "finish" and events[-1].phase == "Building engine"


def test_ort_build_targets_this_cpu_and_is_compatible(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    result = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort"))
    host = host_fingerprint()
    assert result.engine.targets == host.cpu_target
    assert result.engine.key_ingredients["target"]["cpu"] == host.cpu_target
    blob = app_ctx.home / (result.engine.blob_path or "")
    assert blob.read_bytes()[4:8] == b"ORTM", "an ORT-format model"
    verdict = check_engine(app_ctx, result.engine.id or 0)
    assert verdict.verdict == "compatible", verdict.reason


@pytest.mark.usefixtures("requires_no_gpu")
def test_rtx_engine_is_incompatible_on_a_host_without_gpu(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm86",))).engine
    result = run_cli(capsys, "--home", str(app_ctx.home), "check", str(engine.id), "--json")
    assert result.code == 0
    data = result.json()
    assert data["verdict"] == "incompatible"
    assert data["reason"].startswith(
        f"built for SM86 with TensorRT-RTX {engine.backend_version}; this host has no NVIDIA GPU"
    )
    assert data["details"]["validity"] == "INVALID", "TensorRT-RTX's own header check ran"


def _int32_bias_qdq(tmp_path: Path) -> Path:
    """A model that passes planning and that TensorRT-RTX's parser refuses: ORT's symmetric int8 Q/DQ
    with its INT32 bias reached through an Identity, so only the parser sees the INT32 its
    DequantizeLinear reads (planning refuses an INT32 Q/DQ it can see: tests/test_quantized_advice.py)."""
    source = make_conv(tmp_path / "conv.onnx")
    target = quantize_with_ort(source, tmp_path / "conv_int8_default.onnx", symmetric=True)  # INT32 bias: ORT's default
    model = onnx.load(str(target))
    int32 = {t.name for t in model.graph.initializer if t.data_type == onnx.TensorProto.INT32}
    for node in [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in int32]:
        for slot, name in enumerate(node.input):  # the INT32 it reads and its INT32 zero point
            if name in int32:
                model.graph.node.insert(0, onnx.helper.make_node("Identity", [name], [f"{name}_through"]))
                node.input[slot] = f"{name}_through"
    onnx.save(model, str(target))
    return target


def test_failed_build_keeps_only_a_failed_record_with_tensorrt_message(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_model(app_ctx, _int32_bias_qdq(tmp_path), name="badq")
    result = run_cli(
        capsys, "--home", str(app_ctx.home), "build", "badq", "--backend", "rtx", "--target", "sm86", "--json"
    )
    assert result.code == 1
    assert "conv_b_DequantizeLinear" in result.err
    assert "Int32" in result.err
    [engine] = _engines(app_ctx)
    assert engine.status == EngineStatus.FAILED
    assert engine.sha256 is None and engine.blob_path is None
    assert "conv_b_DequantizeLinear" in (engine.error or "")
    assert _store_files(app_ctx) == {"objects": [], "tmp": []}, "no blob, no temp or staging file"
    with pytest.raises(BuildFailedError):
        build_engine(app_ctx, BuildRequest(model="badq", backend="rtx", targets=("sm86",)))


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_bad_build_inputs_exit_2_and_store_nothing(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    wrong_name = _npz(tmp_path / "wrong.npz", features=np.zeros((4, 16), np.float32))
    wrong_rank = _npz(tmp_path / "rank.npz", input=np.zeros((4, 2, 16), np.float32))
    cases = [
        (["--profile", "input=1x3x224x224"], "rank"),
        (["--profile", "tokens=1x16"], "does not have"),
        (["--target", "sm90"], "SM90"),
        (["--target", "banana"], "unknown target"),
        (["--precision", "fp64"], "unknown precision"),
        (["--backend", "xla"], "unknown backend"),
        (["--precision", "int8", "--calib", str(wrong_name)], "features"),
        (["--precision", "int8", "--calib", str(wrong_rank)], "input"),
        (["--precision", "int8", "--calib", str(tmp_path / "absent.npz")], "does not exist"),
        (["--opt-level", "9"], "optimization level"),
        (["--backend", "trt"], "TensorRT is not installed"),
    ]
    for args, message in cases:
        result = run_cli(capsys, "--home", str(app_ctx.home), "build", "mlp", *args)
        assert result.code == 2, (args, result.err)
        assert message in result.err, (args, result.err)
        assert "Traceback" not in result.err
    assert _engines(app_ctx) == []
    models = run_cli(capsys, "--home", str(app_ctx.home), "model", "list", "--json").json()
    assert len(models) == 1, "no converted variant was stored"


def test_verify_marks_a_corrupted_blob(app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    good = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    bad = build_engine(app_ctx, BuildRequest(model="mlp", backend="rtx", targets=("sm86",))).engine
    corrupt_blob(app_ctx.home / (bad.blob_path or ""))
    home = ["--home", str(app_ctx.home)]
    result = run_cli(capsys, *home, "verify", "--all", "--json")
    assert result.code == 1
    by_id = {r["id"]: r for r in result.json()}
    assert by_id[good.id]["ok"] is True
    assert by_id[bad.id]["ok"] is False
    assert by_id[bad.id]["status"] == "CORRUPT"
    shown = run_cli(capsys, *home, "engine", "show", str(bad.id), "--json").json()
    assert shown["status"] == "CORRUPT"
    assert run_cli(capsys, *home, "verify", str(good.id)).code == 0
    assert run_cli(capsys, *home, "verify").code == 2
    (app_ctx.home / (good.blob_path or "")).unlink()
    missing = run_cli(capsys, *home, "check", str(good.id), "--json")
    assert missing.code == 0 and missing.json()["verdict"] == "unknown"
    assert "blob is missing" in missing.json()["reason"]


def test_engine_list_and_show_json(app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    home = ["--home", str(app_ctx.home)]
    built = run_cli(capsys, *home, "build", "mlp", "--backend", "rtx", "--target", "sm89", "--json")
    assert built.code == 0, built.err
    data = built.json()
    for key in (
        "id",
        "model",
        "backend",
        "backend_version",
        "precision",
        "targets",
        "cache_key",
        "sha256",
        "size_bytes",
        "build_seconds",
        "status",
        "path",
        "cache_hit",
    ):
        assert key in data, key
    assert data["cache_hit"] is False and data["model"] == "mlp" and data["targets"] == ["sm89"]
    assert any("default profile for input" in note for note in data["notes"])
    assert Path(data["path"]).is_file()
    again = run_cli(capsys, *home, "build", "mlp", "--backend", "rtx", "--target", "sm89", "--json").json()
    assert again["cache_hit"] is True and again["id"] == data["id"]
    listed = run_cli(capsys, *home, "engine", "list", "--model", "mlp", "--json").json()
    assert [e["id"] for e in listed] == [data["id"]]
    shown = run_cli(capsys, *home, "engine", "show", str(data["id"]), "--json").json()
    assert shown["key_backend"] == "rtx"
    assert shown["key_target"] == {"compute_capabilities": ["sm89"]}
    assert shown["key_onnx_digest"] == shown["key_ingredients"]["onnx_digest"]
    assert "[VERBOSE]" in shown["builder_log"] or "[INFO]" in shown["builder_log"]
    assert shown["host"]["os"] == "Linux"
    head = Path(data["path"]).read_bytes()[:HEAD_BYTES]
    assert shown["header_blake3"] == blake3.blake3(head).hexdigest(), "the digest a load checks the header by"
    assert "header_blake3" not in listed[0], "a listing does not select it"
    text = run_cli(capsys, *home, "engine", "show", str(data["id"])).out
    assert f"header: blake3 {shown['header_blake3']}" in text


@pytest.mark.slow
def test_converted_variant_is_stored_with_lineage(app_ctx: AppContext, tmp_path: Path) -> None:
    source = register_model(app_ctx, make_conv(tmp_path / "conv.onnx"), name="conv").model
    result = build_engine(app_ctx, BuildRequest(model="conv", backend="rtx", targets=("sm86",), precision="int8"))
    engine = result.engine
    assert engine.status == EngineStatus.READY
    assert engine.precision_recipe["tool"] == "modelopt.onnx.quantization"  # TensorRT's int8 recipe
    assert any("uncalibrated" in w for w in engine.warnings)
    with app_ctx.catalog.read() as session:
        from enginecache.db.models import ModelRecord

        variant = session.get(ModelRecord, engine.variant_model_id)
    assert variant is not None and variant.parent_id == source.id
    assert variant.recipe["name"] == "int8"
    stored = onnx.load(str(app_ctx.home / variant.store_path))
    assert any(n.op_type == "QuantizeLinear" for n in stored.graph.node)


def test_an_in_process_build_publishes_its_engine_by_link_without_copying_it(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build outside a job (load_or_build's on a miss) hashes the engine in its work folder and links
    it into the store, as a job's staged engine is: a multi-GB engine is not written twice."""
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")

    def no_copy(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the built engine was copied into the store")

    monkeypatch.setattr(ArtifactStore, "_publish", no_copy)
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    assert engine.status == EngineStatus.READY
    blob = app_ctx.home / (engine.blob_path or "")
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == engine.sha256
    assert blake3.blake3(blob.read_bytes()).hexdigest() == engine.blake3
    assert blob.stat().st_nlink == 1, "the work folder's name for it went with the folder"
    assert _store_files(app_ctx)["tmp"] == [], "nothing is left in the store's scratch folder"
