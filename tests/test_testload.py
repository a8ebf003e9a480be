"""Test-load as a use case, a queue job and a CLI command; load runs recorded and aggregated."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from enginecache.core.fingerprint import host_fingerprint
from enginecache.db.models import EngineRecord, EngineStatus, JobStatus
from enginecache.errors import TestInputError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.submit import get_job, waiting_reason
from enginecache.service.builds.testload import run_test_load, submit_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.loadruns import list_load_runs, load_phase_stats
from enginecache.service.engines.records import get_engine
from enginecache.service.jobs.routing import can_run, describe_requirements, load_requirements, worker_capabilities
from enginecache.service.jobs.worker import WorkerConfig, run_worker
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.conftest import REFERENCE_MODELS, corrupt_blob, reference_catalog
from tests.modelfactory import make_mlp
from tests.test_inputs import make_token_model


def _mlp_engines(app: AppContext, tmp_path: Path) -> tuple[EngineRecord, EngineRecord]:
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    ort = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine
    rtx = build_engine(app, BuildRequest(model="mlp", backend="rtx", targets=("sm86,sm89",))).engine
    return ort, rtx


@pytest.mark.usefixtures("requires_no_gpu")
def test_run_test_load_records_pass_and_incompatible(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app = catalog_ctx
    ort, rtx = _mlp_engines(app, tmp_path)
    passed = run_test_load(app, ort.id or 0, iterations=10, batch=2)
    assert passed.verdict == "PASS", passed.reason
    assert passed.iterations == 10 and passed.batch == 2 and len(passed.samples_ms) == 10
    assert passed.read_verify_s and passed.deserialize_s and passed.first_inference_s
    assert passed.p50_ms is not None and passed.p99_ms is not None and passed.p50_ms <= passed.p99_ms
    assert passed.accuracy[0]["name"] == "output" and passed.accuracy[0]["passed"] is True
    assert passed.host_target == host_fingerprint().cpu_target

    refused = run_test_load(app, rtx.id or 0, iterations=10)
    assert refused.verdict == "INCOMPATIBLE"
    assert refused.details["validity"] == "INVALID" and refused.details["diagnostics_mask"] == 0
    assert "TensorRT-RTX" in refused.reason and "CUDA" in refused.reason
    assert refused.deserialize_s is None and refused.validity_s is not None
    assert get_engine(app, rtx.id or 0).status == EngineStatus.READY, "incompatible is not corrupt"

    runs = list_load_runs(app, ort.id or 0)
    assert [r["verdict"] for r in runs] == ["PASS"]
    assert set(runs[0]["phases"]) == {"read_verify", "validity", "deserialize", "first_inference"}
    stats = load_phase_stats(app)
    assert len(stats) == 1, "INCOMPATIBLE runs did not load: they are not in the load-phase means"
    assert stats[0]["model"] == "mlp" and stats[0]["backend"] == "ort" and stats[0]["runs"] == 1
    assert stats[0]["load_s"] > 0 and stats[0]["build_s"] > 0


def test_corrupt_blob_verdict_marks_the_engine(app_ctx: AppContext, tmp_path: Path) -> None:
    ort, _ = _mlp_engines(app_ctx, tmp_path)
    corrupt_blob(app_ctx.home / (ort.blob_path or ""), 100, mask=0x01)
    run = run_test_load(app_ctx, ort.id or 0)
    assert run.verdict == "CORRUPT"
    assert get_engine(app_ctx, ort.id or 0).status == EngineStatus.CORRUPT


def test_int8_engine_fails_fp32_tolerances_and_passes_its_own(app_ctx: AppContext, tmp_path: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic  # noqa: F401 - the quantizer is installed

    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx", features=64, hidden=64), name="mlp")
    calib = tmp_path / "calib.npz"
    np.savez(calib, input=np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32))
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort", precision="int8", calibration=calib)).engine
    own = run_test_load(app_ctx, engine.id or 0, iterations=2)
    assert own.verdict == "PASS", own.reason
    assert own.tolerances["atol"] == 0.25
    strict = run_test_load(app_ctx, engine.id or 0, iterations=2, tolerances={"atol": 1e-5, "rtol": 1e-5})
    assert strict.verdict == "FAIL" and "outside int8 tolerances" in strict.reason


def test_routing_sends_rtx_test_loads_to_gpu_workers(app_ctx: AppContext, tmp_path: Path) -> None:
    ort, rtx = _mlp_engines(app_ctx, tmp_path)
    rtx_needs = load_requirements(rtx)
    assert rtx_needs == {
        "backend": "rtx",
        "compute_capability_any": ["sm86", "sm89"],
        "backend_version": rtx.backend_version,
        "os": rtx.os,
        "engine": {"targets": ["sm86", "sm89"], "precision": rtx.precision},
    }
    host = host_fingerprint()
    here = worker_capabilities(host)
    assert can_run(load_requirements(ort), here)
    # A worker without a GPU (this host's, less any GPU it has: the test holds on a host with one too).
    assert not can_run(rtx_needs, {**here, "gpus": []}), "a worker without a GPU cannot load an rtx engine"
    if not host.gpus:
        assert not can_run(rtx_needs, here), "this host has no GPU"
    gpu_worker = {**here, "gpus": [{"name": "RTX A6000", "compute_capability": "sm86"}]}
    assert can_run(rtx_needs, gpu_worker)
    other_version = {**gpu_worker, "versions": {**here["versions"], "rtx": "0.0.1"}}
    assert not can_run(rtx_needs, other_version), "the engine loads only with the TensorRT-RTX that built it"
    assert "SM86 or SM89" in describe_requirements(rtx_needs)

    job = submit_test_load(app_ctx, rtx.id or 0)
    assert job.kind == "test_load" and job.requirements == rtx_needs
    reason = waiting_reason(app_ctx, job)
    assert reason is not None and "TensorRT-RTX" in reason and "SM86 or SM89" in reason
    again = submit_test_load(app_ctx, rtx.id or 0)
    assert again.id == job.id, "an identical active request joins the first"
    with pytest.raises(TestInputError, match="iterations"):
        submit_test_load(app_ctx, ort.id or 0, iterations=-1)


@pytest.mark.slow
def test_test_load_job_runs_in_a_worker_child(app_ctx: AppContext, tmp_path: Path) -> None:
    ort, _ = _mlp_engines(app_ctx, tmp_path)
    npz = tmp_path / "inputs.npz"
    np.savez(npz, input=np.full((3, 16), 0.5, np.float32))
    job = submit_test_load(app_ctx, ort.id or 0, iterations=5, inputs=npz)
    assert job.payload["inputs"] != str(npz), "the inputs file is copied into the store"
    ran = run_worker(app_ctx, WorkerConfig(name="t-worker", once=True, lease_seconds=5), install_signals=False)
    assert ran == 1
    done = get_job(app_ctx, job.id or 0)
    assert done.status == JobStatus.SUCCEEDED, done.error
    runs = list_load_runs(app_ctx, ort.id or 0)
    assert runs[0]["job_id"] == job.id and runs[0]["verdict"] == "PASS"
    assert runs[0]["input_shapes"] == {"input": [3, 16]}


def _huge_model(path: Path) -> Path:
    """Declares x[1, 2^40, 2^40]: it registers and builds (nothing is allocated), its inputs cannot be made."""
    huge = [1, 2**40, 2**40]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "huge",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, huge)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, huge)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


@pytest.mark.slow
def test_deterministic_test_load_failures_are_recorded_and_not_retried(app_ctx: AppContext, tmp_path: Path) -> None:
    """Real worker children: inputs the model rejects and a shape too large to generate each record
    an ERROR load run with the reason (the engine page shows it) and FAIL the job at its first
    attempt; the generator's own inputs for the same model PASS."""
    register_model(app_ctx, make_token_model(tmp_path / "tokens.onnx"), name="tokens")
    register_model(app_ctx, _huge_model(tmp_path / "huge.onnx"), name="huge")
    tokens = build_engine(app_ctx, BuildRequest(model="tokens", backend="ort")).engine
    huge = build_engine(app_ctx, BuildRequest(model="huge", backend="ort")).engine
    npz = tmp_path / "bad-ids.npz"
    ids = np.zeros((1, 4), np.int64)
    np.savez(npz, input_ids=ids, kind_ids=ids + 89, token_type_ids=ids, attention_mask=ids + 1)
    generated = submit_test_load(app_ctx, tokens.id or 0, iterations=2)
    rejected = submit_test_load(app_ctx, tokens.id or 0, iterations=2, inputs=npz)
    too_large = submit_test_load(app_ctx, huge.id or 0, iterations=2)
    ran = run_worker(app_ctx, WorkerConfig(name="t-worker", once=True, lease_seconds=5), install_signals=False)
    assert ran == 3

    ok = get_job(app_ctx, generated.id or 0)
    assert ok.status == JobStatus.SUCCEEDED, ok.error
    runs = {r["job_id"]: r for r in list_load_runs(app_ctx, tokens.id or 0)}
    assert runs[generated.id]["verdict"] == "PASS", runs[generated.id]["reason"]
    made = runs[generated.id]["details"]["inputs"]
    assert made["kind_ids"] == "integers in [0, 2) (Gather indices into kinds)"

    bad = get_job(app_ctx, rejected.id or 0)
    assert bad.status == JobStatus.FAILED and bad.attempts == 1, (bad.status, bad.attempts, bad.error)
    assert "idx=89 must be within the inclusive range [-2,1]" in (bad.error or "")
    run = runs[rejected.id]
    assert run["verdict"] == "ERROR" and "idx=89" in run["reason"]
    assert run["details"]["error_type"] == "InferenceError" and run["phases"]["deserialize"] > 0

    big = get_job(app_ctx, too_large.id or 0)
    assert big.status == JobStatus.FAILED and big.attempts == 1, (big.status, big.attempts, big.error)
    [run] = list_load_runs(app_ctx, huge.id or 0)
    assert run["job_id"] == too_large.id and run["verdict"] == "ERROR"
    assert f"input 'x' of shape [1, {2**40}, {2**40}] (float32) would need {4 * 2**80} bytes" in run["reason"]
    assert run["details"]["error_type"] == "TestInputError" and run["phases"] == {}
    assert run_worker(app_ctx, WorkerConfig(name="t-worker", once=True), install_signals=False) == 0, "no retry"


def test_bad_requests_run_here_are_error_runs(app_ctx: AppContext, tmp_path: Path) -> None:
    """Before, a batch outside the profile raised and left no run; now it is an ERROR run too."""
    ort, _ = _mlp_engines(app_ctx, tmp_path)
    run = run_test_load(app_ctx, ort.id or 0, batch=10_000)
    assert run.verdict == "ERROR" and "outside input input's profile range" in run.reason
    assert [r["verdict"] for r in list_load_runs(app_ctx, ort.id or 0)] == ["ERROR"]


@pytest.fixture
def cli_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[AppContext, EngineRecord, EngineRecord]]:
    home = tmp_path / "home"
    monkeypatch.setenv("ENGINECACHE_HOME", str(home))
    app = AppContext.from_settings(home)
    ort, rtx = _mlp_engines(app, tmp_path)
    yield app, ort, rtx
    app.close()


@pytest.mark.slow
@pytest.mark.usefixtures("requires_no_gpu")
def test_cli_test_load(
    capsys: pytest.CaptureFixture[str], cli_home: tuple[AppContext, EngineRecord, EngineRecord]
) -> None:
    _, ort, rtx = cli_home
    ok = run_cli(capsys, "test-load", str(ort.id), "--iterations", "5", "--json")
    assert ok.code == 0, ok.err
    data = ok.json()
    assert data["verdict"] == "PASS" and data["latency"]["iterations"] == 5 and data["job_id"] is not None

    nobody = run_cli(capsys, "test-load", str(rtx.id))
    assert nobody.code == 1
    assert "no worker can load engine" in nobody.err and "SM86 or SM89" in nobody.err

    here = run_cli(capsys, "test-load", str(rtx.id), "--here")
    assert here.code == 1
    assert "INCOMPATIBLE" in here.out and "TensorRT-RTX" in here.out

    queued = run_cli(capsys, "test-load", str(rtx.id), "--queue", "--json")
    assert queued.code == 0 and queued.json()["waiting"].startswith("waiting for a worker with TensorRT-RTX")


# -- the four reference models --------------------------------------------------------------


@pytest.fixture(scope="module")
def shared_app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppContext]:
    yield from reference_catalog(tmp_path_factory.mktemp("shared-testload"))


@pytest.mark.shared
@pytest.mark.parametrize("name", sorted(REFERENCE_MODELS))
def test_shared_model_ort_fp32_passes(shared_app: AppContext, name: str) -> None:
    engine = build_engine(shared_app, BuildRequest(model=name, backend="ort")).engine
    run = run_test_load(shared_app, engine.id or 0, iterations=3)
    assert run.verdict == "PASS", run.reason
    assert all(a["cosine"] > 0.99999 for a in run.accuracy)
    assert run.load_s is not None and run.load_s > 0


@pytest.mark.shared
@pytest.mark.parametrize(
    ("name", "precision"),
    [("resnet18", "fp16"), ("bert_mini", "fp16"), ("mobilenet_v3_small", "int8"), ("resnet18", "int8")],
)
def test_shared_model_reduced_precision_verdicts(
    shared_app: AppContext, tmp_path: Path, name: str, precision: str
) -> None:
    calib = None
    if precision == "int8":
        calib = tmp_path / "calib.npz"
        np.savez(calib, input=np.random.default_rng(0).standard_normal((4, 3, 224, 224)).astype(np.float32))
    converter = "onnxconverter" if precision == "fp16" else None
    request = BuildRequest(model=name, backend="ort", precision=precision, calibration=calib, converter=converter)
    engine = build_engine(shared_app, request).engine
    run = run_test_load(shared_app, engine.id or 0, iterations=3)
    assert run.verdict == "PASS", run.reason
    assert run.tolerances["atol"] == {"fp16": 1e-2, "int8": 0.25}[precision]
    assert any(a["max_abs"] > 0 for a in run.accuracy), "a reduced-precision engine is not bit-exact"
    strict = run_test_load(shared_app, engine.id or 0, iterations=0, tolerances={"atol": 0.0, "rtol": 0.0})
    assert strict.verdict == "FAIL"


# -- the job-kind table ---------------------------------------------------------------------


def test_job_kinds_table(monkeypatch: pytest.MonkeyPatch) -> None:
    from enginecache.service.builds.testloadjob import run_test_load_job
    from enginecache.service.jobs import kinds as jobkinds
    from tests.jobkinds_for_tests import run_crash, run_sleep

    monkeypatch.setattr(jobkinds, "JOB_RUNNERS", {})
    assert jobkinds.job_runner("test_load") is run_test_load_job
    assert jobkinds.job_runner("sleep") is None, "a kind nobody added is unknown"
    jobkinds.register_job_kind("sleep", run_sleep)
    assert jobkinds.job_runner("sleep") is run_sleep
    jobkinds.register_job_kind("sleep", run_sleep)  # the same runner again: a no-op
    with pytest.raises(ValueError, match="already registered"):
        jobkinds.register_job_kind("sleep", run_crash)
    with pytest.raises(ValueError, match="already registered"):
        jobkinds.register_job_kind("test_load", run_sleep)
    monkeypatch.setattr(jobkinds, "JOB_RUNNERS", {})
    with pytest.raises(ValueError, match="is the product's"):
        jobkinds.register_job_kind("build", run_sleep)  # not yet resolved, still the product's


def test_inputs_that_do_not_fit_are_refused_at_submit_by_the_cli_too(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one check the dashboard's uploader uses (service.builds.testinputs): a dtype or a dimension the
    engine does not take is refused before anything is queued, naming it, not cast in the job."""
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    wrong_dtype = tmp_path / "f64.npz"
    np.savez(wrong_dtype, input=np.ones((2, 16), dtype=np.float64))
    with pytest.raises(TestInputError, match="'input' is float64, the engine takes float32"):
        submit_test_load(app_ctx, engine.id or 0, inputs=wrong_dtype)
    wrong_width = tmp_path / "w.npz"
    np.savez(wrong_width, input=np.ones((2, 15), dtype=np.float32))
    where = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    refused = run_cli(capsys, *where, "test-load", str(engine.id), "--inputs", str(wrong_width), "--json")
    assert refused.code == 2 and "does not fit the engine" in refused.json()["error"], refused.err
    with app_ctx.catalog.read() as session:
        from sqlmodel import select

        from enginecache.db.models import JobRecord

        assert [j.kind for j in session.exec(select(JobRecord)).all()] == [], "no test-load queued"
