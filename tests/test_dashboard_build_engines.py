"""The dashboard's Build and Engines views under Streamlit's AppTest, on a real SQLite catalog in
a temp dir: the matrix submits and cancels jobs; Engines filters, verifies, checks compatibility,
diffs cache keys, retires and shows test-loads. Every test writes to its own copy of the catalog
seeded once for the module."""

from __future__ import annotations

import pytest
from sqlmodel import select

from enginecache.core.backends.registry import get_backend
from enginecache.dashboard.views.build import target_options
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus, utcnow
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.readmodels.engines import EngineFilter, engine_page
from enginecache.service.readmodels.hosts import HostRow
from tests.conftest import corrupt_blob
from tests.dashboardkit import Seeded, engine_view, frame, plain, queued_jobs, texts, view


def test_build_matrix_submits_one_job_per_cell_and_marks_cached(seeded: Seeded) -> None:
    at = view("build").run()
    assert not at.exception
    precisions = at.multiselect(key=f"build_precisions_{seeded.model_id}")
    assert precisions.value == ["fp32"], "fp16 has not built for this model: not preselected"
    precisions.set_value(["fp32", "fp16"]).run()
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm86", "TensorRT-RTX sm89"]).run()
    matrix = frame(at, "target", "fp32").set_index("target")
    assert matrix.loc["TensorRT-RTX sm86", "fp32"] == f"cached (engine {seeded.engine_id})"
    assert matrix.loc["TensorRT-RTX sm89", "fp16"] == "new build"
    profile = frame(at, "input", "min", "opt", "max")
    assert profile.loc[0, "min"] == "1x3x32x32" and profile.loc[0, "max"] == "8x3x32x32"
    assert at.button(key="build_submit").label == "Submit 3 build(s)"
    at.button(key="build_submit").click().run()
    assert not at.exception
    jobs = queued_jobs(seeded.app)
    cells = sorted((j.payload["targets"][0], j.payload["precision"]) for j in jobs)
    assert cells == [("sm86", "fp16"), ("sm89", "fp16"), ("sm89", "fp32")]
    successes = [str(s.value) for s in at.success]
    assert len(successes) == 3, "only the cells submitted are reported: a cached cell is not submitted"
    assert sum("queued job" in s for s in successes) == 3
    matrix = frame(at, "target", "fp32").set_index("target")
    assert matrix.loc["TensorRT-RTX sm89", "fp32"].startswith("queued (job ")
    # the job list, from the catalog: one card per queued job, each with a cancel button
    assert all(at.button(key=f"build_cancel_{j.id}") for j in jobs)
    first = min(j.id or 0 for j in jobs)
    at.button(key=f"build_cancel_{first}").click().run()
    with seeded.app.catalog.read() as session:
        cancelled = session.get(JobRecord, first)
    assert cancelled is not None and cancelled.status == JobStatus.CANCELLED


@pytest.mark.slow
def test_build_preselects_fp16_only_once_an_fp16_engine_of_the_model_is_ready(seeded: Seeded) -> None:
    request = BuildRequest(model=str(seeded.model_id), backend="rtx", precision="fp16", targets=("sm86",))
    built = build_engine(seeded.app, request).engine
    assert built.status == EngineStatus.READY and built.precision == "fp16"
    at = view("build").run()
    assert not at.exception
    assert at.multiselect(key=f"build_precisions_{seeded.model_id}").value == ["fp32", "fp16"]


def test_build_int8_without_calibration_says_why(seeded: Seeded) -> None:
    at = view("build").run()
    at.multiselect(key=f"build_precisions_{seeded.model_id}").set_value(["int8"]).run()
    assert any("needs calibration data" in e.value for e in at.error)
    assert at.button(key="build_submit").disabled


@pytest.mark.slow
def test_engines_filter_detail_verify_and_check(seeded: Seeded) -> None:
    at = view("engines").run()
    assert not at.exception
    table = frame(at, "id", "sha256", "created")
    assert table["id"].tolist() == [seeded.engine_id]
    with seeded.app.catalog.read() as session:
        engine = session.get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.sha256 is not None
    text = texts(at)
    assert engine.sha256 in text and engine.cache_key in text
    ingredients = frame(at, "ingredient", "value")
    assert ingredients["ingredient"].tolist()[:2] == ["schema", "onnx_digest"]
    assert engine.onnx_digest in ingredients.set_index("ingredient").loc["onnx_digest", "value"]
    at.button(key="engines_verify").click().run()
    assert any(f"sha256 {engine.sha256} matches" in str(s.value) for s in at.success)
    at.button(key="engines_check").click().run()
    verdict = next(plain(m.value) for m in at.markdown if "gpu-box-1" in plain(m.value))
    assert "(online)" in verdict and ("**compatible**" in verdict or "**incompatible**" in verdict)
    assert "built for SM86 with TensorRT-RTX" in verdict  # the backend's own rule, in its words
    # filters run in SQL: a precision with no engines empties the page
    at.selectbox(key="engines_f_precision").set_value("fp32").run()
    assert frame(at, "id", "sha256", "created")["id"].tolist() == [seeded.engine_id]
    at.selectbox(key="engines_f_status").set_value("READY").run()
    assert "1 engine(s) match" in texts(at)


def test_engines_verify_reports_a_corrupt_blob(seeded: Seeded) -> None:
    with seeded.app.catalog.read() as session:
        engine = session.get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.blob_path is not None
    corrupt_blob(seeded.app.home / engine.blob_path)
    at = view("engines").run()
    at.button(key="engines_verify").click().run()
    assert any("CORRUPT" in e.value for e in at.error)
    with seeded.app.catalog.read() as session:
        row = session.get(EngineRecord, seeded.engine_id)
    assert row is not None and row.status == EngineStatus.CORRUPT


def test_engines_why_miss_diffs_key_fields_and_retire(seeded: Seeded) -> None:
    at = view("engines").run()
    at.radio(key="engines_miss_mode").set_value("a build request").run()
    at.selectbox(key="engines_miss_target").set_value("TensorRT-RTX sm89").run()
    diff = frame(at, "field")
    assert diff["field"].tolist() == ["target.compute_capabilities"]
    at.selectbox(key="engines_miss_target").set_value("TensorRT-RTX sm86").run()
    assert any("Same cache key" in str(s.value) for s in at.success)
    # retire asks for confirmation, then marks RETIRED
    at.button(key="engines_retire").click().run()
    assert any("Confirm retire" in w.value for w in at.warning)
    at.button(key="engines_retire").click().run()
    with seeded.app.catalog.read() as session:
        row = session.get(EngineRecord, seeded.engine_id)
    assert row is not None and row.status == EngineStatus.RETIRED


def test_engines_test_load_button_queues_a_job(seeded: Seeded) -> None:
    ort = build_engine(seeded.app, BuildRequest(model="convnet", backend="ort")).engine
    at = engine_view(ort.id or 0).run()  # the seeded worker is this host: it runs ONNX Runtime engines
    at.button(key="engines_testload").click().run()
    assert not at.error, [e.value for e in at.error]
    with seeded.app.catalog.read() as session:
        job = session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).one()
    assert job.payload["engine_id"] == ort.id
    assert any(f"Test-load job {job.id} is queued" in str(i.value) for i in at.info)


@pytest.mark.usefixtures("requires_no_gpu")
def test_engines_show_test_load_results(seeded: Seeded) -> None:
    from enginecache.service.builds.testload import run_test_load

    ort = build_engine(seeded.app, BuildRequest(model="convnet", backend="ort")).engine
    run = run_test_load(seeded.app, ort.id or 0, iterations=15)
    assert run.verdict == "PASS"
    at = engine_view(ort.id or 0).run()
    assert not at.exception
    assert any("**PASS**" in str(s.value) for s in at.success)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["p50 latency"].endswith(" ms") and metrics["throughput"].endswith("/s")
    accuracy = frame(at, "output", "cosine", "max abs err", "atol")  # with the tolerances it was judged by
    assert list(accuracy["output"]) == ["output"] and list(accuracy["verdict"]) == ["PASS"]
    runs = frame(at, "verdict", "load ms")
    assert list(runs["verdict"]) == ["PASS"]
    chart_keys = {c.proto.id for c in at.get("plotly_chart")}
    assert len(chart_keys) >= 2, "phases bar and latency histogram"

    rtx = run_test_load(seeded.app, seeded.engine_id, iterations=5)
    assert rtx.verdict == "INCOMPATIBLE"
    at = engine_view(seeded.engine_id).run()
    assert any("**INCOMPATIBLE**" in str(e.value) and "TensorRT-RTX" in plain(e.value) for e in at.error), [
        e.value for e in at.error
    ]


def test_stats_engine_page_filters_by_whole_target(seeded: Seeded) -> None:
    page = engine_page(seeded.app, EngineFilter(target="sm8"))
    assert page.total == 0
    page = engine_page(seeded.app, EngineFilter(target="sm86"))
    assert [r.id for r in page.rows] == [seeded.engine_id]


def _worker(hostname: str, capabilities: dict[str, object]) -> HostRow:
    now = utcnow()
    return HostRow(f"w-{hostname}", hostname, 1, "online", True, now, now, None, {}, dict(capabilities))


def test_build_targets_come_from_the_backends_and_the_workers() -> None:
    rtx = get_backend("rtx")
    gpu_box = _worker(
        "gpu-box",
        {
            "backends": ["rtx", "trt", "ort"],
            "gpus": [{"name": "NVIDIA L4", "compute_capability": "sm89"}],
            "cpu_target": "x86_64-avx2",
        },
    )
    cpu_box = _worker("cpu-box", {"backends": ["ort"], "gpus": [], "cpu_target": "aarch64-neon"})
    options = target_options([gpu_box, cpu_box])
    assert [(t.backend, t.target) for t in options] == [
        *(("rtx", sm) for sm in rtx.known_targets()),
        ("trt", "sm89"),
        ("ort", "aarch64-neon"),
        ("ort", "x86_64-avx2"),
    ]
    labels = [t.label for t in options]
    assert labels[0] == f"TensorRT-RTX {rtx.known_targets()[0]}"
    assert labels[-3:] == [
        "TensorRT sm89 (NVIDIA L4 on gpu-box)",
        "ONNX Runtime aarch64-neon (cpu-box)",
        "ONNX Runtime x86_64-avx2 (gpu-box)",
    ]
    # no worker yet: TensorRT (builds on its GPU) offers nothing; ONNX Runtime builds for the worker's CPU
    alone = target_options([])
    assert [(t.backend, t.target, t.label) for t in alone if t.backend != "rtx"] == [
        ("ort", "", "ONNX Runtime (this server's CPU)")
    ]
