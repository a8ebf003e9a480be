"""`engine import`: engines built outside enginecache, by a plain script calling TensorRT-RTX (or ONNX
Runtime) directly, registered against a model, checked against their own header, UNPROVEN until a
host that can run one has loaded it, and kept out of default lookups until then."""

from __future__ import annotations

import json
from pathlib import Path

import onnxruntime as ort
import pytest
import tensorrt_rtx as trt
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from enginecache.core.backends.trt.header import parse
from enginecache.core.cachekey import UNKNOWN
from enginecache.core.fingerprint import GpuInfo, HostFingerprint, host_fingerprint
from enginecache.dashboard.data import ROLE_STATE
from enginecache.db import engines
from enginecache.db.models import AuditEventRecord, EngineRecord, EngineStatus
from enginecache.errors import AccessDeniedError, ImportRefusedError, MissError
from enginecache.service.access.audit import Actor, acting_as, list_audit
from enginecache.service.builds.plan import BuildRequest, find_ready_engine, plan_build
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.importing import ImportRequest, import_engine
from enginecache.service.engines.records import get_engine
from enginecache.service.fleet.profiles import Wanted, model_profiles
from enginecache.service.models.register import register_model
from enginecache.service.readmodels.listing import show_engine
from enginecache.service.serving.lookup import explain_miss
from tests.clirunner import run_cli
from tests.conftest import files_under
from tests.dashboardkit import Seeded, engine_view, plain, texts
from tests.modelfactory import file_sha256, make_mlp

# -- engines built by a plain script, the way a team's CI builds them --------------------------


def rtx_plan(onnx_path: Path, out: Path, capabilities: tuple[str, ...]) -> Path:
    """Build a TensorRT-RTX plan of `onnx_path` for `capabilities` ("SM86", ...) with tensorrt_rtx
    alone (no enginecache code), with one profile for the dynamic batch."""
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse_from_file(str(onnx_path)), [parser.get_error(i) for i in range(parser.num_errors)]
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    profile.set_shape("input", (1, 16), (4, 16), (8, 16))
    config.add_optimization_profile(profile)
    config.num_compute_capabilities = len(capabilities)
    for index, capability in enumerate(capabilities):
        config.set_compute_capability(getattr(trt.ComputeCapability, capability), index)
    plan = builder.build_serialized_network(network, config)
    assert plan is not None
    out.write_bytes(bytes(plan))
    return out


def ort_engine(onnx_path: Path, out: Path) -> Path:
    """An ORT-format model of `onnx_path` optimized for this CPU by onnxruntime alone."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(out)
    options.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    return out


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MLP's ONNX and its plans, built once: for SM86, for SM86 and SM89, and an ORT engine."""
    folder = tmp_path_factory.mktemp("plans")
    onnx_path = make_mlp(folder / "mlp.onnx")
    return {
        "onnx": onnx_path,
        "sm86": rtx_plan(onnx_path, folder / "sm86.plan", ("SM86",)),
        "sm86_89": rtx_plan(onnx_path, folder / "sm86_89.plan", ("SM86", "SM89")),
        "ort": ort_engine(onnx_path, folder / "mlp.ort"),
    }


@pytest.fixture
def app(app_ctx: AppContext, plans: dict[str, Path]) -> AppContext:
    register_model(app_ctx, plans["onnx"], name="mlp")
    return app_ctx


def request(path: Path, **changes: object) -> ImportRequest:
    fields: dict[str, object] = {"model": "mlp", "backend": "rtx", "precision": "fp32", "targets": ("sm86",)}
    return ImportRequest(path=path, **{**fields, **changes})  # type: ignore[arg-type]


def engine_rows(app: AppContext) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(EngineRecord)).all())


def gpu_host(cc: str, **packages: str) -> HostFingerprint:
    gpu = GpuInfo(index=0, name="NVIDIA test GPU", uuid="GPU-test", compute_capability=cc, memory_total_bytes=2**34)
    here = host_fingerprint()
    return here.replace(hostname=f"host-{cc}", gpus=(gpu,), packages={**here.packages, **packages})


# -- the header ---------------------------------------------------------------------------------


def test_the_header_reader_reads_what_the_builder_was_asked(plans: dict[str, Path]) -> None:
    """The layout `trt.header` relies on, against plans this test built: a wrong bit would fail here."""
    one = parse(plans["sm86"].read_bytes()[:64])
    both = parse(plans["sm86_89"].read_bytes()[:64])
    assert one.problem is None and one.targets == ("sm86",) and one.other_bits == 0
    assert both.targets == ("sm86", "sm89")
    assert one.version_text == ".".join(trt.__version__.split(".")[:3])
    assert parse(b"x" * 64).problem is not None and parse(b"vtrt").problem is not None


# -- import -------------------------------------------------------------------------------------


def test_a_plain_script_rtx_engine_imports_unproven_with_its_provenance(
    app: AppContext, plans: dict[str, Path]
) -> None:
    result = import_engine(app, request(plans["sm86"], notes="CI run 42"))
    engine = get_engine(app, result.engine_id)
    assert engine.status == EngineStatus.UNPROVEN and result.status == "UNPROVEN"
    assert (engine.targets, engine.backend, engine.backend_version) == ("sm86", "rtx", "1.7.1")
    assert engine.sha256 == file_sha256(plans["sm86"]) and engine.size_bytes == plans["sm86"].stat().st_size
    stored = app.home / (engine.blob_path or "")
    assert stored.read_bytes() == plans["sm86"].read_bytes(), "copied into the store"
    assert engine.header_blake3 and engine.blake3, "hashed as a build's blob is"

    provenance = engine.provenance
    assert provenance["kind"] == "imported" and provenance["source"].endswith(str(plans["sm86"]))
    assert provenance["declared"]["targets"] == ["sm86"] and provenance["declared"]["notes"] == "CI run 42"
    assert provenance["header"]["targets"] == ["sm86"] and provenance["header"]["backend_version"] == "1.7.1"
    assert provenance["header"]["checks"]["validity"] == "INVALID", "TensorRT-RTX's own check ran (no GPU here)"

    # known ingredients as a build has them, the rest marked unknown, so no build's key is shadowed
    ingredients = engine.key_ingredients
    assert ingredients["target"] == {"compute_capabilities": ["sm86"]} and ingredients["onnx_digest"]
    assert ingredients["build_options"]["opt_level"] == UNKNOWN and ingredients["os"] == UNKNOWN
    assert "build_options.profiles" in result.unknown and "backend_version" not in result.unknown
    plan = plan_build(app, BuildRequest(model="mlp", backend="rtx", targets=("sm86",)))
    assert plan.cache_key != engine.cache_key and find_ready_engine(app, plan.cache_key) is None

    (event,) = list_audit(app, action=engines.ENGINE_IMPORT)
    assert event.target == f"engine {engine.id}" and event.details["declared"]["notes"] == "CI run 42"
    assert event.details["proven"]["targets"] == ["sm86"] and event.actor

    shown = show_engine(app, engine.id or 0)
    assert shown["status"] == "UNPROVEN" and shown["provenance"]["kind"] == "imported"


def test_the_targets_come_from_the_header_where_none_are_declared(app: AppContext, plans: dict[str, Path]) -> None:
    result = import_engine(app, request(plans["sm86_89"], targets=()))
    assert result.targets == ("sm86", "sm89") and get_engine(app, result.engine_id).targets == "sm86,sm89"


def test_a_header_that_contradicts_the_declared_target_is_refused_naming_both(
    app: AppContext, plans: dict[str, Path]
) -> None:
    before = files_under(app.home / "objects")
    with pytest.raises(ImportRefusedError) as refused:
        import_engine(app, request(plans["sm86"], targets=("sm89",)))
    assert "built for SM86" in str(refused.value) and "--target SM89" in str(refused.value)
    with pytest.raises(ImportRefusedError, match=r"built for SM86,SM89.*--target SM86"):
        import_engine(app, request(plans["sm86_89"], targets=("sm86",)))
    with pytest.raises(ImportRefusedError, match=r"TensorRT-RTX 1\.7\.1 wrote it.*--backend-version 1\.6\.0"):
        import_engine(app, request(plans["sm86"], backend_version="1.6.0"))
    assert engine_rows(app) == [] and files_under(app.home / "objects") == before, "nothing stored"
    assert list_audit(app, action=engines.ENGINE_IMPORT) == []


def test_bytes_that_are_no_engine_of_the_backend_are_refused(
    app: AppContext, plans: dict[str, Path], tmp_path: Path
) -> None:
    junk = tmp_path / "junk.plan"
    junk.write_bytes(b"not an engine" * 100)
    with pytest.raises(ImportRefusedError, match="TensorRT-RTX's header check says it is not one of its engines"):
        import_engine(app, request(junk))
    with pytest.raises(ImportRefusedError, match="ORT-format"):
        import_engine(app, request(plans["sm86"], backend="ort", targets=("cpu",)))
    assert engine_rows(app) == []


def test_the_same_bytes_again_answer_the_engine_and_another_declaration_is_refused(
    app: AppContext, plans: dict[str, Path]
) -> None:
    first = import_engine(app, request(plans["sm86"]))
    again = import_engine(app, request(plans["sm86"]))
    assert again.already and again.engine_id == first.engine_id and len(engine_rows(app)) == 1
    with pytest.raises(ImportRefusedError, match=f"engine {first.engine_id} already"):
        import_engine(app, request(plans["sm86"], precision="fp16"))


def test_importing_needs_the_operator_role(app: AppContext, plans: dict[str, Path]) -> None:
    with acting_as(Actor("viewer@example.com", "dashboard 10.0.0.9")), pytest.raises(AccessDeniedError):
        import_engine(app, request(plans["sm86"]))
    assert engine_rows(app) == []


# -- declared only, and out of default lookups ---------------------------------------------------


def test_a_declared_only_trt_engine_is_unproven_and_out_of_default_lookups(app: AppContext, tmp_path: Path) -> None:
    """TensorRT is not installed here: nothing is read from the file, every fact is declared; the
    engine is listed but never selected unless pinned, and a miss names it."""
    plan = tmp_path / "model.engine"
    plan.write_bytes(bytes(range(256)) * 64)
    declared = request(plan, backend="trt", targets=("sm86",), backend_version="10.13.0", precision="fp16")
    result = import_engine(app, declared)
    engine = get_engine(app, result.engine_id)
    assert engine.status == EngineStatus.UNPROVEN and engine.provenance["header"]["targets"] is None
    assert engine.key_ingredients["target"] == {"compute_capability": "sm86", "gpu": UNKNOWN}
    assert engine.target_info == {"compute_capability": "sm86"}, "no marker reaches the row's own columns"
    assert "precision.conversion" in result.unknown

    host = gpu_host("sm86", tensorrt="10.13.0.35")
    listed = model_profiles(app, "mlp", host=host)
    (profile,) = listed.profiles
    assert profile.status == "UNPROVEN" and profile.verdict == "compatible" and "UNPROVEN" in profile.reason
    assert profile.provenance == "imported" and profile.to_dict()["provenance"] == "imported"
    assert listed.selected is None, "not selected by default"
    assert model_profiles(app, "mlp", host=host, wanted=Wanted(engine_id=engine.id)).selected is not None
    assert model_profiles(app, "mlp", host=host, wanted=Wanted(unproven=True)).selected is not None

    miss = explain_miss(app, plan_build(app, BuildRequest(model="mlp", backend="rtx", targets=("sm86",))), host)
    assert isinstance(miss, MissError) and "UNPROVEN" not in str(miss), "another backend's import is not named"


def test_a_miss_says_an_unproven_import_exists(app: AppContext, plans: dict[str, Path]) -> None:
    result = import_engine(app, request(plans["sm86"]))
    plan = plan_build(app, BuildRequest(model="mlp", backend="rtx", targets=("sm86",)))
    miss = explain_miss(app, plan, gpu_host("sm86"))
    assert f"imported engine {result.engine_id} is UNPROVEN" in str(miss)
    assert f"enginecache test-load {result.engine_id}" in str(miss)


# -- proven by a load on a host that can run it ---------------------------------------------------


def test_a_passing_test_load_proves_an_import_in_the_same_transaction(
    catalog_ctx: AppContext, plans: dict[str, Path]
) -> None:
    """An ORT engine (this CPU can run it) imported without a profile: the test-load feeds the model's
    default profile, passes, and the engine is READY with the proof recorded and audited (SQLite and
    PostgreSQL: the gateway's INSERT ... RETURNING and JSON columns on both)."""
    app = catalog_ctx
    register_model(app, plans["onnx"], name="mlp")
    here = host_fingerprint()
    declared = request(
        plans["ort"], backend="ort", targets=(here.cpu_target,), backend_version=ort.__version__, precision="fp32"
    )
    result = import_engine(app, declared)
    assert get_engine(app, result.engine_id).status == EngineStatus.UNPROVEN
    assert model_profiles(app, "mlp").selected is None

    run = run_test_load(app, result.engine_id, iterations=2)
    assert run.verdict == "PASS", run.reason
    engine = get_engine(app, result.engine_id)
    assert engine.status == EngineStatus.READY
    assert engine.provenance["proven"]["host"] == here.hostname and engine.provenance["proven"]["by"] == "test-load"
    (event,) = list_audit(app, action=engines.ENGINE_PROVEN)
    assert event.target == f"engine {engine.id}" and event.details["was"] == "UNPROVEN"
    selected = model_profiles(app, "mlp").selected
    assert selected is not None and selected.engine_id == engine.id, "proven: selected as any READY engine"


def test_a_failed_load_leaves_it_unproven(app: AppContext, plans: dict[str, Path]) -> None:
    """An RTX engine on this host (no GPU): INCOMPATIBLE, recorded, still UNPROVEN."""
    result = import_engine(app, request(plans["sm86"]))
    run = run_test_load(app, result.engine_id, iterations=1)
    assert run.verdict == "INCOMPATIBLE"
    assert get_engine(app, result.engine_id).status == EngineStatus.UNPROVEN


def test_a_restored_import_that_was_never_proven_goes_back_to_unproven(app: AppContext, plans: dict[str, Path]) -> None:
    result = import_engine(app, request(plans["sm86"]))
    actor = Actor("ops", "cli test")
    with app.catalog.changes() as ex:
        engines.mark_corrupt(ex, result.engine_id, actor=actor, by="verify", reason="test")
    from enginecache.service.engines.records import verify_engines

    (verified,) = verify_engines(app, [result.engine_id])
    assert verified.ok and verified.status == "UNPROVEN"
    assert get_engine(app, result.engine_id).status == EngineStatus.UNPROVEN, "never READY without a proof"
    with app.catalog.read() as session:
        actions = [e.action for e in session.exec(select(AuditEventRecord)).all() if e.action.startswith("engine.")]
    assert actions == [engines.ENGINE_IMPORT, engines.ENGINE_CORRUPT, engines.ENGINE_UNPROVEN]


# -- the command line ---------------------------------------------------------------------------


def test_cli_engine_import_json_and_refusals(
    app: AppContext, plans: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    home = ["--home", str(app.home)]
    base = [*home, "engine", "import", str(plans["sm86"]), "--model", "mlp", "--backend", "rtx", "--precision", "fp32"]
    done = run_cli(capsys, *base, "--target", "sm86", "--json")
    assert done.code == 0, done.err
    data = done.json()
    assert data["status"] == "UNPROVEN" and data["targets"] == ["sm86"] and data["provenance"]["kind"] == "imported"

    refused = run_cli(capsys, *base, "--target", "sm89", "--json")
    assert refused.code == 2
    error = json.loads(refused.out)  # exactly one document
    assert error["kind"] == "import_refused" and "SM86" in error["error"] and "SM89" in error["error"]

    missing = run_cli(capsys, *home, "engine", "import", str(plans["sm86"]), "--model", "mlp", "--json")
    assert missing.code == 2 and "--backend, --precision" in json.loads(missing.out)["error"]

    shown = run_cli(capsys, *home, "engine", "show", str(data["id"]))
    assert shown.code == 0 and "provenance: imported by" in shown.out and "header proves:" in shown.out
    assert "proven: not yet" in shown.out


# -- the dashboard's engine page ------------------------------------------------------------------


def _import_form(seeded: Seeded, plan: Path, targets: str) -> AppTest:
    """The Engines view, its import form filled for `plan` (the MLP, registered in the seeded catalog)
    and submitted."""
    at = engine_view(seeded.engine_id).run()
    at.get("file_uploader")[-1].upload(plan.name, plan.read_bytes()).run()
    at.text_input(key="engines_import_model").set_value("mlp")
    at.selectbox(key="engines_import_backend").set_value("rtx")
    at.selectbox(key="engines_import_precision").set_value("fp32")
    at.text_input(key="engines_import_targets").set_value(targets)
    at.text_area(key="engines_import_notes").set_value("nightly CI").run()
    at.button(key="engines_import_submit").click().run()
    assert not at.exception, at.exception
    return at


def test_the_engine_page_imports_and_shows_the_provenance(seeded: Seeded, plans: dict[str, Path]) -> None:
    register_model(seeded.app, plans["onnx"], name="mlp")
    at = _import_form(seeded, plans["sm86"], "sm86")
    (imported,) = [e for e in engine_rows(seeded.app) if e.provenance]
    assert imported.status == EngineStatus.UNPROVEN and imported.provenance["source"] == "dashboard upload sm86.plan"
    assert imported.provenance["declared"]["notes"] == "nightly CI" and imported.sha256 == file_sha256(plans["sm86"])
    assert f"engine {imported.id} (UNPROVEN)" in plain(texts(at)), "the outcome"
    shown = texts(engine_view(imported.id or 0).run())
    assert "**provenance** imported" in shown and "header proves: format TensorRT-RTX 1.7.1 plan" in plain(shown)
    built = texts(engine_view(seeded.engine_id).run())
    assert "**provenance** built here" in built


def test_the_engine_page_refuses_a_contradicting_header_and_stores_nothing(
    seeded: Seeded, plans: dict[str, Path]
) -> None:
    register_model(seeded.app, plans["onnx"], name="mlp")
    at = _import_form(seeded, plans["sm86"], "sm89")
    errors = " ".join(plain(e.value) for e in at.error)
    assert "built for SM86" in errors and "--target SM89" in errors
    assert [e for e in engine_rows(seeded.app) if e.provenance] == []


def test_a_viewer_gets_no_import_form(seeded: Seeded) -> None:
    at = engine_view(seeded.engine_id)
    at.session_state[ROLE_STATE] = "viewer"
    at.run()
    assert not at.exception
    assert "engines_import_submit" not in [b.key for b in at.button] and not at.get("file_uploader")


def test_an_import_where_a_pool_key_is_set_is_signed_naming_the_importer(
    app: AppContext, plans: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the importing process holds the pool's signing key, the import is signed at once: its
    statement binds the stored bytes to the model and names the importer and the source, and `check`
    finds the signature vouches for the row. Without a key it stays unsigned."""
    import json

    from enginecache.core import signing
    from enginecache.service.engines.records import check_engine

    unsigned = import_engine(app, request(plans["sm86"]))
    assert get_engine(app, unsigned.engine_id).signature is None
    private, public, key_id = signing.generate_key(tmp_path / "keys", "pool")
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, private)
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, public)
    monkeypatch.setenv(signing.RECEIPTS_ENV, str(tmp_path / "receipts"))
    signed = import_engine(app, request(plans["sm86_89"], targets=("sm86", "sm89")))
    engine = get_engine(app, signed.engine_id)
    assert engine.signature is not None and key_id in engine.signature
    statement = json.loads(engine.signed_statement or "{}")
    assert statement["engine"]["sha256"] == engine.sha256 and statement["model"]["name"] == "mlp"
    assert statement["origin"]["kind"] == "imported" and statement["origin"]["source"], statement["origin"]
    assert check_engine(app, signed.engine_id).verdict.outcome not in ("TAMPERED", "UNTRUSTED")
