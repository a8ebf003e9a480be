"""Engine bundles: a TensorRT-LLM-style folder (config.json, rank0.engine, rank1.engine, a tokenizer)
whose rank files are real TensorRT-RTX engines built by a plain script, imported as one engine whose
blob is its manifest, every file verified, laid out as a folder with all files or none (a process
SIGKILLed half way leaves nothing visible), and answered as a verified folder or rank file."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from enginecache.core.blobpaths import blob_path
from enginecache.core.enginebundle import BundleError, BundleFile, BundleManifest, parse_manifest
from enginecache.core.objectstore import blob_key
from enginecache.db import engines
from enginecache.db.models import EngineStatus, utcnow
from enginecache.errors import (
    BadInputError,
    EngineCacheError,
    ExportError,
    ImportRefusedError,
    IncompatibleEngineError,
    IntegrityCheckError,
)
from enginecache.service.access import audit
from enginecache.service.access.audit import current_actor
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import (
    bundle_path,
    import_engine_or_bundle,
    is_bundle,
    place_bundle,
    verify_bundle,
)
from enginecache.service.engines.records import get_engine, verify_engines
from enginecache.service.engines.remoteverify import verify_remote
from enginecache.service.engines.runtimeproof import confirm_runtime_load
from enginecache.service.fleet.exports import export_model, verify_tree
from enginecache.service.fleet.profiles import Wanted
from enginecache.service.fleet.pull import pull
from enginecache.service.maintenance.backup.usecases import backup, restore
from enginecache.service.maintenance.gc.collect import collect_garbage
from enginecache.service.models.register import register_model
from enginecache.service.serving.bundleload import BundleSession
from enginecache.service.serving.runtime import load_or_build
from tests.clirunner import run_cli
from tests.conftest import files_under
from tests.modelfactory import make_mlp
from tests.s3kit import BUCKET, running_server, use_env
from tests.test_engine_import import engine_rows, gpu_host, request, rtx_plan

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = json.dumps({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}}).encode()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MLP's ONNX and two real TensorRT-RTX plans for SM86 (rank 0 and 1: weights of two seeds, so
    their bytes differ as two ranks' do), one for SM89, built once."""
    folder = tmp_path_factory.mktemp("bundleplans")
    onnx_path = make_mlp(folder / "mlp.onnx")
    return {
        "onnx": onnx_path,
        "rank0": rtx_plan(onnx_path, folder / "r0.plan", ("SM86",)),
        "rank1": rtx_plan(make_mlp(folder / "rank1.onnx", seed=1), folder / "r1.plan", ("SM86",)),
        "sm89": rtx_plan(onnx_path, folder / "sm89.plan", ("SM89",)),
    }


def make_bundle(root: Path, built: dict[str, Path], rank1: str = "rank1") -> Path:
    """The four-file bundle: config.json, rank0.engine, rank1.engine, tokenizer/tokenizer.json."""
    root.mkdir(parents=True)
    config = {"pretrained_config": {"mapping": {"tp_size": 2}}, "build_config": {"max_batch_size": 8}}
    (root / "config.json").write_text(json.dumps(config))
    (root / "rank0.engine").write_bytes(built["rank0"].read_bytes())
    (root / "rank1.engine").write_bytes(built[rank1].read_bytes())
    (root / "tokenizer").mkdir()
    (root / "tokenizer" / "tokenizer.json").write_bytes(TOKENIZER)
    return root


@pytest.fixture
def app(app_ctx: AppContext, built: dict[str, Path]) -> AppContext:
    register_model(app_ctx, built["onnx"], name="mlp")
    return app_ctx


def same_files(a: Path, b: Path) -> bool:
    listed = files_under(a)
    return listed == files_under(b) and all((a / p).read_bytes() == (b / p).read_bytes() for p in listed)


def test_a_four_file_bundle_imports_as_one_engine_named_by_its_manifest(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    source = make_bundle(tmp_path / "llm", built)
    result = import_engine_or_bundle(app, request(source, notes="trtllm-build run 7"))
    engine = get_engine(app, result.engine_id)
    assert engine.status == EngineStatus.UNPROVEN and is_bundle(engine)
    assert (engine.backend, engine.targets, engine.backend_version) == ("rtx", "sm86", "1.7.1")
    manifest_bytes = blob_path(app.home, engine.sha256).read_bytes()
    assert hashlib.sha256(manifest_bytes).hexdigest() == engine.sha256, "the engine's identity is its manifest"
    manifest = parse_manifest(manifest_bytes)
    assert [f.path for f in manifest.files] == [
        "config.json",
        "rank0.engine",
        "rank1.engine",
        "tokenizer/tokenizer.json",
    ]
    for entry in manifest.files:
        data = (source / entry.path).read_bytes()
        assert (entry.size, entry.sha256) == (len(data), hashlib.sha256(data).hexdigest())
        assert blob_path(app.home, entry.sha256).read_bytes() == data, "each file is its own blob"
    assert [f.path for f in manifest.ranks] == ["rank0.engine", "rank1.engine"]
    bundle = engine.provenance["bundle"]
    assert bundle["ranks"] == ["rank0.engine", "rank1.engine"] and bundle["size_bytes"] == manifest.size
    assert engine.provenance["header"]["targets"] == ["sm86"]

    again = import_engine_or_bundle(app, request(source))
    assert again.already and again.engine_id == result.engine_id and len(engine_rows(app)) == 1


def test_a_rank_whose_header_contradicts_the_declaration_is_refused_before_anything_is_stored(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    before = files_under(app.home / "objects")
    mixed = make_bundle(tmp_path / "mixed", built, rank1="sm89")
    with pytest.raises(ImportRefusedError, match=r"rank1\.engine.*SM89"):
        import_engine_or_bundle(app, request(mixed))
    with pytest.raises(ImportRefusedError, match="disagree"):
        import_engine_or_bundle(app, request(mixed, targets=()))
    assert engine_rows(app) == [] and files_under(app.home / "objects") == before


def test_layouts_and_manifests_that_are_no_bundle_are_refused(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    linked = make_bundle(tmp_path / "linked", built)
    (linked / "extra.json").symlink_to(linked / "config.json")
    with pytest.raises(BundleError, match=r"extra\.json.*symlink"):
        import_engine_or_bundle(app, request(linked))
    bare = make_bundle(tmp_path / "bare", built)
    (bare / "config.json").unlink()
    with pytest.raises(BundleError, match=r"config\.json"):
        import_engine_or_bundle(app, request(bare))
    assert engine_rows(app) == []
    digest = "0" * 64
    for bad in ("../x", "/etc/passwd", "a/./b", "a\\b", ""):
        with pytest.raises(BundleError):
            BundleManifest(
                (
                    BundleFile("config.json", 1, digest, ""),
                    BundleFile("rank0.engine", 1, digest, ""),
                    BundleFile(bad, 1, digest, ""),
                )
            )
    good = BundleManifest((BundleFile("config.json", 1, digest, ""), BundleFile("rank0.engine", 1, digest, "")))
    assert parse_manifest(good.to_bytes()) == good
    with pytest.raises(BundleError, match=r"'\.\.' part"):
        parse_manifest(good.to_bytes().replace(b'"config.json"', b'"../config.json"'))


def test_every_file_is_verified(app: AppContext, built: dict[str, Path], tmp_path: Path) -> None:
    engine = get_engine(app, import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id)
    manifest = verify_bundle(app, engine)
    (fine,) = verify_engines(app, [engine.id or 0])
    assert fine.ok and "4 files matches too" in fine.message and fine.status == EngineStatus.UNPROVEN
    tokenizer = blob_path(app.home, manifest.file("tokenizer/tokenizer.json").sha256)
    os.chmod(tokenizer, 0o644)
    tokenizer.write_bytes(TOKENIZER.replace(b"BPE", b"BPX"))
    with pytest.raises(IntegrityCheckError, match=r"tokenizer/tokenizer\.json"):
        verify_bundle(app, engine)
    (damaged,) = verify_engines(app, [engine.id or 0])
    assert not damaged.ok and damaged.status == EngineStatus.CORRUPT and "tokenizer/tokenizer.json" in damaged.message
    assert get_engine(app, engine.id or 0).status == EngineStatus.CORRUPT, "enginecache verify marks it"
    with pytest.raises(IntegrityCheckError, match=r"tokenizer/tokenizer\.json"):
        place_bundle(app, engine, tmp_path / "out")
    assert files_under(tmp_path / "out") == [] and not list(tmp_path.glob(".out.*")), "nothing visible, nothing left"


def test_a_bundle_is_exported_as_a_folder_and_answered_as_a_verified_folder_or_rank(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    source = make_bundle(tmp_path / "llm", built)
    engine = get_engine(app, import_engine_or_bundle(app, request(source)).engine_id)
    exported = place_bundle(app, engine, tmp_path / "export" / "mlp" / "1")
    assert same_files(exported, source)
    folder = bundle_path(app, engine)
    assert same_files(folder, source) and bundle_path(app, engine, rank=1) == folder / "rank1.engine"
    with pytest.raises(BundleError, match=r"rank5\.engine"):
        bundle_path(app, engine, rank=5)
    (folder / "rank0.engine").unlink()
    (folder / "rank0.engine").write_bytes(b"not the engine")
    with pytest.raises(IntegrityCheckError, match=r"rank0\.engine"):
        bundle_path(app, engine)
    assert same_files(bundle_path(app, engine), source), "placed again from the store"


KILLER = """
import os, signal, sys
from pathlib import Path
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import place_bundle
from enginecache.service.engines.records import get_engine
app = AppContext.from_settings(Path(sys.argv[1]))
placed = []
def crash(path):
    placed.append(path)
    if len(placed) == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
place_bundle(app, get_engine(app, int(sys.argv[2])), Path(sys.argv[3]), on_file=crash)
"""


def test_a_placement_killed_half_way_leaves_nothing_visible(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    source = make_bundle(tmp_path / "llm", built)
    engine_id = import_engine_or_bundle(app, request(source)).engine_id
    dest = tmp_path / "second" / "llm"
    for after in (1, 2):
        run = subprocess.run(
            [sys.executable, "-c", KILLER, str(app.home), str(engine_id), str(dest), str(after)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == -9, run.stderr
        assert not dest.exists(), "a killed placement shows no folder"
        assert len(list(dest.parent.glob(".llm.*.partial"))) == 1
    place_bundle(app, get_engine(app, engine_id), dest)
    assert same_files(dest, source) and not list(dest.parent.glob(".llm.*.partial")), "the stale folder is gone"


def test_engine_import_takes_a_folder_on_the_command_line(
    app: AppContext, built: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = make_bundle(tmp_path / "llm", built)
    args = ["--home", str(app.home), "engine", "import", str(source), "--model", "mlp", "--backend", "rtx"]
    done = run_cli(capsys, *args, "--target", "sm86", "--precision", "fp32", "--json")
    assert done.code == 0, done.err
    data = done.json()
    assert data["status"] == "UNPROVEN" and data["provenance"]["bundle"]["files"][-1] == "tokenizer/tokenizer.json"


# -- pull onto a second home --------------------------------------------------------------------

PULL_KILLER = """
import os, signal, sys
from pathlib import Path
from enginecache.service.context import AppContext
from enginecache.service.fleet import pull as pulling
from enginecache.service.fleet.profiles import Wanted
from tests.test_engine_import import gpu_host
app = AppContext.from_settings(Path(sys.argv[1]))
real = pulling.copy_resumable
copies = []
def counted(*args, **kwargs):
    done = real(*args, **kwargs)
    copies.append(done)
    if len(copies) == int(sys.argv[4]):
        os.kill(os.getpid(), signal.SIGKILL)
    return done
pulling.copy_resumable = counted
pulling.pull(app, "mlp", Path(sys.argv[3]), wanted=Wanted(engine_id=int(sys.argv[2])), host=gpu_host("sm86"))
"""


def test_a_bundle_is_pulled_atomically_onto_a_second_home(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """Killed after the manifest blob, after one file and after every file: no manifest and no folder
    are visible; the next pull finishes (resuming what landed) and lays the folder out whole."""
    source = make_bundle(tmp_path / "llm", built)
    engine_id = import_engine_or_bundle(app, request(source)).engine_id
    engine = get_engine(app, engine_id)
    for after in (1, 2, 5):  # copies: the manifest blob, then config.json, ..., tokenizer/tokenizer.json
        dest = tmp_path / f"second-{after}"
        run = subprocess.run(
            [sys.executable, "-c", PULL_KILLER, str(app.home), str(engine_id), str(dest), str(after)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == -9, run.stderr
        assert len(files_under(dest / "objects")) == after, "the kill came after that many copies"
        assert not (dest / "manifests").exists(), "no manifest"
        assert not (dest / "bundles").exists() or list((dest / "bundles").iterdir()) == [], "no folder"
        done = pull(app, "mlp", dest, wanted=Wanted(engine_id=engine_id), host=gpu_host("sm86"))
        folder = dest / done.manifest["bundle"]["dir"]
        assert same_files(folder, source) and done.manifest["bundle"]["ranks"] == ["rank0.engine", "rank1.engine"]
        assert not list((dest / "bundles").glob(".*")), "the killed pull's hidden folder is gone"
    assert done.sha256 == engine.sha256 and json.loads(done.manifest_path.read_text())["bundle"]["dir"]
    again = pull(app, "mlp", dest, wanted=Wanted(engine_id=engine_id), host=gpu_host("sm86"))
    assert again.up_to_date and again.copied_bytes == 0

    tokenizer = folder / "tokenizer" / "tokenizer.json"
    os.chmod(tokenizer, 0o644)
    tokenizer.write_bytes(b"{}")  # a hard link: the object in DEST is damaged with it
    repaired = pull(app, "mlp", dest, wanted=Wanted(engine_id=engine_id), host=gpu_host("sm86"))
    assert not repaired.up_to_date and same_files(dest / repaired.manifest["bundle"]["dir"], source)


def test_a_bundle_is_pulled_within_a_disk_budget_that_counts_every_file(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """`pull --max-bytes` counts a bundle's manifest and every file: a budget they do not fit is
    refused before anything lands; a newer bundle pulled in its place evicts the old one's files and
    its folder (hard links of them, which would otherwise keep their space)."""
    first_id = import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id
    second_source = make_bundle(tmp_path / "llm2", built)
    (second_source / "tokenizer" / "tokenizer.json").write_bytes(TOKENIZER + b" ")  # a new tokenizer, same ranks
    second_id = import_engine_or_bundle(app, request(second_source)).engine_id
    second = verify_bundle(app, get_engine(app, second_id))
    second_blobs = {get_engine(app, second_id).sha256} | {f.sha256 for f in second.files}
    second_bytes = int(get_engine(app, second_id).size_bytes or 0) + second.size
    dest, host = tmp_path / "node", gpu_host("sm86")

    with pytest.raises(BadInputError, match=r"--max-bytes 1000 is smaller than the engine's 5 blobs"):
        pull(app, "mlp", dest, wanted=Wanted(engine_id=first_id), host=host, max_bytes=1000)
    assert not (dest / "objects").exists() or files_under(dest / "objects") == [], "nothing landed"

    first = pull(app, "mlp", dest, wanted=Wanted(engine_id=first_id), host=host, max_bytes=second_bytes)
    old_folder = dest / first.manifest["bundle"]["dir"]
    assert old_folder.is_dir()
    done = pull(app, "mlp", dest, wanted=Wanted(engine_id=second_id), host=host, max_bytes=second_bytes)
    assert same_files(dest / done.manifest["bundle"]["dir"], second_source)
    assert not old_folder.exists(), "the folder no manifest names went with its files"
    landed = {path.name: path.stat().st_size for path in (dest / "objects").rglob("*") if path.is_file()}
    assert set(landed) == second_blobs and sum(landed.values()) <= second_bytes
    assert done.evicted is not None and done.evicted.evicted, "the first bundle's own files were evicted"


def test_load_or_build_answers_a_pulled_bundle_as_its_verified_folder(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """RTX rank engines cannot be deserialized on this CPU host: what is proven is the folder handed
    to a runtime that loads folders, each file checked against the manifest."""
    source = make_bundle(tmp_path / "llm", built)
    engine_id = import_engine_or_bundle(app, request(source)).engine_id
    done = pull(app, "mlp", tmp_path / "pod", wanted=Wanted(engine_id=engine_id), host=gpu_host("sm86"))
    loaded = load_or_build(done.manifest_path, spec=None)
    session = loaded.session
    assert isinstance(session, BundleSession) and loaded.outcome == "hit"
    assert loaded.raw == session.path == done.dest / done.manifest["bundle"]["dir"] and same_files(session.path, source)
    assert session.rank_path(1).read_bytes() == built["rank1"].read_bytes()
    with pytest.raises(EngineCacheError, match="engine bundle"):
        loaded.infer({})
    loaded.close()
    rank0 = session.path / "rank0.engine"
    os.chmod(rank0, 0o644)
    with open(rank0, "r+b") as stream:
        stream.seek(100)
        stream.write(b"\xff")
    with pytest.raises(IntegrityCheckError, match=r"rank0\.engine"):
        load_or_build(done.manifest_path, spec=None)


# -- export -------------------------------------------------------------------------------------


def prove(app: AppContext, engine_id: int) -> None:
    """The catalog's own transition a passing test-load makes on a GPU host (none here loads RTX ranks)."""
    with app.catalog.changes() as ex:
        engines.mark_proven(ex, engine_id, at=utcnow(), host="gpu-host", actor=current_actor(), by="test-load")


def test_a_proven_bundle_is_exported_into_the_tree_layout_as_a_folder(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """Exports take READY engines; no host here can load RTX ranks, so the catalog's own transition
    a passing test-load makes on a GPU host stands in for it."""
    source = make_bundle(tmp_path / "llm", built)
    prove(app, import_engine_or_bundle(app, request(source)).engine_id)
    result = export_model(app, "mlp", tmp_path / "tree", fmt="tree")
    folder = result.root / "sm86.fp32.bundle"
    assert same_files(folder, source) and verify_tree(result.root) == []
    (entry,) = result.manifest["engines"]
    assert entry["file"] == "sm86.fp32.bundle" and len(entry["bundle"]["files"]) == 4
    again = export_model(app, "mlp", tmp_path / "tree", fmt="tree")
    assert same_files(again.root / "sm86.fp32.bundle", source), "exported over itself"
    config = folder / "config.json"
    os.chmod(config, 0o644)
    config.write_text("{}")  # through the hard link: the store's blob too, as a damaged disk would
    assert any("config.json" in problem for problem in verify_tree(result.root))


def test_a_proven_bundle_is_exported_for_tritons_tensorrtllm_backend(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """Triton serves a TensorRT-LLM engine folder with its `tensorrtllm` backend: config.pbtxt names
    the folder (gpt_model_path) and the batch size trtllm-build was given; the folder holds every file,
    verified. Parsed with Triton's own schema (tritonclient, a dev dependency)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    source = make_bundle(tmp_path / "llm", built)
    prove(app, import_engine_or_bundle(app, request(source)).engine_id)
    result = export_model(app, "mlp", tmp_path / "triton", fmt="triton")
    version = result.root / "1"
    assert same_files(version, source)
    config = text_format.Parse((result.root / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert (config.backend, config.max_batch_size, config.platform) == ("tensorrtllm", 8, "")
    assert config.parameters["gpt_model_path"].string_value == str(version.resolve())
    assert config.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert [t.name for t in config.input][:3] == ["input_ids", "input_lengths", "request_output_len"]
    assert "output_ids" in [t.name for t in config.output]
    assert result.warnings and "TensorRT-RTX" in result.warnings[0], "RTX ranks: stock Triton cannot load them"
    again = export_model(app, "mlp", tmp_path / "triton", fmt="triton")
    assert same_files(again.root / "1", source), "exported over itself"


def test_a_bundle_triton_cannot_batch_or_bundles_for_two_gpus_are_refused_by_name(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    source = make_bundle(tmp_path / "llm", built)
    (source / "config.json").write_text(json.dumps({"pretrained_config": {}}))
    prove(app, import_engine_or_bundle(app, request(source)).engine_id)
    with pytest.raises(ExportError, match=r"build_config\.max_batch_size"):
        export_model(app, "mlp", tmp_path / "triton", fmt="triton")
    other = tmp_path / "sm89"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"build_config": {"max_batch_size": 4}}))
    (other / "rank0.engine").write_bytes(built["sm89"].read_bytes())
    prove(app, import_engine_or_bundle(app, request(other, targets=("sm89",))).engine_id)
    with pytest.raises(ExportError, match=r"different GPUs.*sm86.*sm89"):
        export_model(app, "mlp", tmp_path / "triton2", fmt="triton")
    assert not (tmp_path / "triton2" / "mlp" / "1").exists()


def test_gc_keeps_every_file_of_a_bundle_its_engine_needs(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """Only the manifest is the engine's blob: without the files' digests in its row gc would take
    the rest as unreferenced once they are older than the temp age."""
    engine = get_engine(app, import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id)
    later = utcnow() + timedelta(days=2)
    report = collect_garbage(app, apply=True, clock=lambda: later)
    assert [r for r in report.removals if "objects" in str(r)] == []
    assert len(verify_bundle(app, engine).files) == 4


def test_a_test_load_of_a_bundle_is_an_error_run_that_leaves_it_unproven(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """Its blob is a manifest: handed to TensorRT-RTX as a plan it would be refused, and CORRUPT
    would be the wrong verdict."""
    engine_id = import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id
    run = run_test_load(app, engine_id, host=gpu_host("sm86"))
    assert run.verdict == "ERROR" and "engine bundle" in (run.reason or "")
    assert get_engine(app, engine_id).status == EngineStatus.UNPROVEN


def test_a_runtime_load_confirmed_on_a_stand_in_gpu_host_makes_a_pulled_bundle_ready(
    app: AppContext, built: dict[str, Path], tmp_path: Path
) -> None:
    """`engine confirm-load`: TensorRT-LLM loads a bundle's folder, which enginecache cannot; the serving
    host confirms it. The host is a recorded fingerprint of an SM86 GPU host (none here), the folder
    the real pulled one; the proof is checked against the rule and the bytes before READY is recorded."""
    source = make_bundle(tmp_path / "llm", built)
    engine_id = import_engine_or_bundle(app, request(source)).engine_id
    done = pull(app, "mlp", tmp_path / "pod", wanted=Wanted(engine_id=engine_id), host=gpu_host("sm86"))
    folder = done.dest / done.manifest["bundle"]["dir"]

    with pytest.raises(IncompatibleEngineError, match="cannot load on this host"):
        confirm_runtime_load(app, engine_id, folder, host=gpu_host("sm89"))
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for entry in ("config.json", "rank0.engine", "rank1.engine"):
        (damaged / entry).write_bytes((folder / entry).read_bytes())
    with pytest.raises(IntegrityCheckError, match="does not hold exactly"):
        confirm_runtime_load(app, engine_id, damaged, host=gpu_host("sm86"))
    assert get_engine(app, engine_id).status == EngineStatus.UNPROVEN, "nothing recorded by a refusal"

    proof = confirm_runtime_load(app, engine_id, folder, host=gpu_host("sm86"), note="trtllm serve ready")
    assert proof.changed and (proof.was, proof.status) == (EngineStatus.UNPROVEN, EngineStatus.READY)
    engine = get_engine(app, engine_id)
    proven = engine.provenance["proven"]
    assert engine.status == EngineStatus.READY and proven["by"] == "runtime-load" and proven["host"] == "host-sm86"
    assert proven["path"] == str(folder.resolve()) and proven["note"] == "trtllm serve ready"
    assert audit.list_audit(app, action="engine.proven")[0].target == f"engine {engine_id}"
    assert not confirm_runtime_load(app, engine_id, folder, host=gpu_host("sm86")).changed
    assert export_model(app, "mlp", tmp_path / "triton", fmt="triton").manifest["engine"] == engine_id


def test_engine_confirm_load_on_this_cpu_host_is_refused_with_one_json_document(
    app: AppContext, built: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine_id = import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id
    folder = bundle_path(app, get_engine(app, engine_id))
    args = ("--home", str(app.home), "engine", "confirm-load", str(engine_id), str(folder), "--json")
    done = run_cli(capsys, *args)
    assert done.code == 1 and "cannot load on this host" in done.json()["error"]
    assert get_engine(app, engine_id).status == EngineStatus.UNPROVEN


def test_a_backup_restores_every_file_of_a_bundle(
    app: AppContext, built: dict[str, Path], tmp_path: Path, app_factory: Callable[..., AppContext]
) -> None:
    engine_id = import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id
    result = backup(app, tmp_path / "backup")
    target = app_factory(home=tmp_path / "restored")
    restore(target, result.dest)
    manifest = verify_bundle(target, get_engine(target, engine_id))
    assert len(manifest.files) == 4 and same_files(bundle_path(target, get_engine(target, engine_id)), tmp_path / "llm")


def test_a_bundle_is_pulled_from_the_object_store_onto_a_home_with_no_store_folder(
    app: AppContext, built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Imported with the object store configured (every file published to the bucket), pulled by a
    host whose home holds none of them: each file is fetched by ranged GETs and verified."""
    with running_server() as server:
        use_env(monkeypatch, server.env(f"bundle-{uuid.uuid4().hex[:12]}"))
        source = make_bundle(tmp_path / "llm", built)
        engine_id = import_engine_or_bundle(app, request(source)).engine_id
        serving = AppContext.from_settings(tmp_path / "serving-home", app.db_url)
        try:
            done = pull(serving, "mlp", tmp_path / "pod", wanted=Wanted(engine_id=engine_id), host=gpu_host("sm86"))
        finally:
            serving.close()
    assert files_under(tmp_path / "serving-home" / "objects") == [], "nothing came from a store folder"
    assert done.copied_bytes >= sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    assert same_files(done.dest / done.manifest["bundle"]["dir"], source)


def test_verify_remote_checks_every_file_of_a_bundle_in_the_object_store(
    app: AppContext, built: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manifest object alone proves nothing of the files: a tampered tokenizer object is found and
    named by its path in the bundle."""
    with running_server() as server:
        prefix = f"bundle-{uuid.uuid4().hex[:12]}"
        use_env(monkeypatch, server.env(prefix))
        engine_id = import_engine_or_bundle(app, request(make_bundle(tmp_path / "llm", built))).engine_id
        [clean] = verify_remote(app, [engine_id])
        assert clean.ok, clean.message
        tokenizer = verify_bundle(app, get_engine(app, engine_id)).file("tokenizer/tokenizer.json")
        server.s3().put_object(Bucket=BUCKET, Key=f"{prefix}/{blob_key(tokenizer.sha256)}", Body=b"{}" + TOKENIZER[2:])
        [bad] = verify_remote(app, [engine_id])
    assert not bad.ok and "tokenizer/tokenizer.json" in bad.message
    assert "tokenizer/tokenizer.json" in (get_engine(app, engine_id).remote_problem or "")
