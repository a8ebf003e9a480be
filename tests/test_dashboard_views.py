"""Each dashboard view under Streamlit's AppTest, on a real SQLite catalog in a temp dir."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from enginecache.core.fingerprint import host_fingerprint
from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus, ModelRecord, utcnow
from enginecache.service import stats
from enginecache.service.builds import BuildRequest, build_engine
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from enginecache.service.models import register_model
from enginecache.service.routing import worker_capabilities
from tests.modelfactory import make_conv, make_external_data_model, make_mlp

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60


@dataclass
class Seeded:
    app: AppContext
    model_id: int
    engine_id: int
    failed_job_id: int
    model_file: Path


def _view(name: str) -> AppTest:
    return AppTest.from_string(f"from dashboard.views import {name}\n{name}.render()\n", default_timeout=TIMEOUT)


def _frame(at: AppTest, *columns: str) -> pd.DataFrame:
    """The first dataframe (or data editor) shown with all these columns (AppTest gives tables no key)."""
    for element in [*at.dataframe, *at.get("arrow_data_frame")]:
        value = element.value
        if all(c in value.columns for c in columns):
            return value
    raise AssertionError(f"no table with columns {columns}")


def _texts(at: AppTest) -> str:
    parts = [e.value for e in at.markdown] + [e.value for e in at.caption] + [e.value for e in at.subheader]
    parts += [e.value for e in at.title] + [str(e.value) for e in at.success] + [str(e.value) for e in at.info]
    return "\n".join(str(p) for p in parts)


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    home = tmp_path / "home"
    monkeypatch.setenv(HOME_ENV, str(home))
    monkeypatch.delenv(DB_URL_ENV, raising=False)
    ctx = AppContext.from_settings(home)
    yield ctx
    ctx.close()


@pytest.fixture
def seeded(catalog: AppContext, tmp_path: Path) -> Seeded:
    """One model with a READY rtx fp32 engine, a registered worker, and a failed job."""
    model_file = make_conv(tmp_path / "models" / "convnet.onnx")
    model = register_model(catalog, model_file).model
    built = build_engine(catalog, BuildRequest(model="convnet", backend="rtx", targets=("sm86",), precision="fp32"))
    host = host_fingerprint()
    queue.register_worker(
        catalog.catalog,
        name="worker-a",
        hostname="gpu-box-1",
        pid=1234,
        fingerprint=host.to_dict(),
        capabilities=worker_capabilities(host),
    )
    with catalog.catalog.write() as session:
        failed = JobRecord(
            kind="build",
            status=JobStatus.FAILED,
            payload={"model": str(model.id), "backend": "rtx", "precision": "int8", "targets": ["sm89"]},
            requirements={"backend": "rtx"},
            error="calibration data does not match input 'input': expected float32",
            finished_at=utcnow(),
        )
        session.add(failed)
    return Seeded(catalog, model.id or 0, built.engine.id or 0, failed.id or 0, model_file)


def test_router_serves_the_overview_first(seeded: Seeded) -> None:
    at = AppTest.from_file(str(ROOT / "enginecache" / "dashboard" / "app.py"), default_timeout=TIMEOUT).run()
    assert not at.exception
    assert at.title[0].value == "Overview"


def test_overview_shows_counts_failures_and_activity(seeded: Seeded) -> None:
    at = _view("overview").run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Models"] == "1"
    assert metrics["Engines"] == "1"
    assert metrics["Jobs"] == "1"
    assert metrics["Workers online"] == "1"
    engines = _frame(at, "status", "count")
    assert engines.set_index("status").loc["READY", "count"] == 1
    jobs = [f for f in at.dataframe if "count" in f.value.columns][1].value
    assert jobs.set_index("status").loc["FAILED", "count"] == 1
    failures = _frame(at, "what", "reason")
    assert f"job {seeded.failed_job_id}" in failures["what"].tolist()
    assert any("calibration data does not match" in r for r in failures["reason"])
    assert len(at.get("plotly_chart")) == 1  # cache activity: one build today


def test_models_lists_and_details_dynamic_dims_ops_and_lineage(seeded: Seeded) -> None:
    at = _view("models").run()
    assert not at.exception
    table = _frame(at, "name", "kind", "engines")
    assert table["name"].tolist() == ["convnet"]
    inputs = _frame(at, "dynamic dims")
    assert inputs.loc[0, "name"] == "input"
    assert inputs.loc[0, "dynamic dims"] == "batch"
    assert inputs.loc[0, "shape"] == "[batch, 3, 32, 32]"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Opset"] == "17"
    assert metrics["Parameters"] == f"{8 * 3 * 3 * 3 + 8 + 8 * 10:,d}"
    model = seeded.app.catalog.read().__enter__().get(ModelRecord, seeded.model_id)
    assert model is not None and model.digest in _texts(at)
    lineage = _frame(at, "built from", "newest engine")
    assert lineage.loc[0, "precision"] == "fp32" and lineage.loc[0, "newest engine"] == seeded.engine_id
    assert len(at.get("plotly_chart")) == 1  # op histogram


def test_models_upload_registers_an_onnx_with_external_data(catalog: AppContext, tmp_path: Path) -> None:
    model_file = make_external_data_model(tmp_path / "ext")
    at = _view("models").run()
    uploader = at.get("file_uploader")[0]
    uploader.set_value(
        [
            (model_file.name, model_file.read_bytes(), "application/octet-stream"),
            (model_file.name + ".data", (model_file.parent / (model_file.name + ".data")).read_bytes(), "x/y"),
        ]
    )
    at.text_input(key="models_upload_name").set_value("uploaded-ext").run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    assert any("Registered: uploaded-ext" in str(s.value) for s in at.success)
    assert _frame(at, "name", "kind", "engines")["name"].tolist() == ["uploaded-ext"]
    with catalog.catalog.read() as session:
        stored = session.exec(select(ModelRecord)).one()
    assert stored.info["external_data_files"] == ["ext.onnx.data"]


def test_models_upload_of_a_zip_folder_is_extracted_and_registered(catalog: AppContext, tmp_path: Path) -> None:
    model_file = make_mlp(tmp_path / "m" / "mlp.onnx")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.write(model_file, "folder/mlp.onnx")
    at = _view("models").run()
    at.get("file_uploader")[0].upload("model.zip", buffer.getvalue()).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.error, [e.value for e in at.error]
    assert _frame(at, "name", "kind", "engines")["name"].tolist() == ["mlp"]


def _store_is_empty(app: AppContext) -> bool:
    with app.catalog.read() as session:
        none_recorded = session.exec(select(ModelRecord)).first() is None
    models_dir = app.home / "models"
    return none_recorded and (not models_dir.exists() or not any(models_dir.iterdir()))


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("broken.onnx", b"this is not a protobuf at all" * 10, "broken.onnx"),
        ("empty.onnx", b"", "empty"),
        ("notes.txt", b"hello", "holds no .onnx file"),
    ],
)
def test_models_bad_upload_shows_the_reason_and_stores_nothing(
    catalog: AppContext, name: str, content: bytes, reason: str
) -> None:
    at = _view("models").run()
    at.get("file_uploader")[0].upload(name, content).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    assert len(at.error) == 1
    assert "upload rejected" in at.error[0].value and reason in at.error[0].value
    assert _store_is_empty(catalog)


def _tar_with(member: tarfile.TarInfo, payload: bytes = b"") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.addfile(member, io.BytesIO(payload) if payload else None)
    return buffer.getvalue()


def test_models_unsafe_archives_are_refused_and_store_nothing(catalog: AppContext, tmp_path: Path) -> None:
    model_bytes = make_mlp(tmp_path / "mlp.onnx").read_bytes()
    climbing = tarfile.TarInfo("../evil.onnx")
    climbing.size = len(model_bytes)
    link = tarfile.TarInfo("model/mlp.onnx")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    absolute = io.BytesIO()
    with zipfile.ZipFile(absolute, "w") as archive:
        archive.writestr("/abs/mlp.onnx", model_bytes)
    cases = [
        ("climb.tar", _tar_with(climbing, model_bytes), "climbs out"),
        ("link.tar", _tar_with(link), "is a link"),
        ("abs.zip", absolute.getvalue(), "absolute path"),
    ]
    for name, content, reason in cases:
        at = _view("models").run()
        at.get("file_uploader")[0].upload(name, content).run()
        at.button(key="models_upload_submit").click().run()
        assert len(at.error) == 1 and reason in at.error[0].value, (name, [e.value for e in at.error])
    assert _store_is_empty(catalog)
    assert not (tmp_path / "evil.onnx").exists()


def test_models_register_a_bad_server_path_shows_the_reason(catalog: AppContext, tmp_path: Path) -> None:
    at = _view("models").run()
    at.text_input(key="models_path").set_value(str(tmp_path / "missing.onnx")).run()
    at.button(key="models_path_submit").click().run()
    assert len(at.error) == 1 and "missing.onnx" in at.error[0].value
    assert _store_is_empty(catalog)


def test_build_matrix_submits_one_job_per_cell_and_marks_cached(seeded: Seeded) -> None:
    at = _view("build").run()
    assert not at.exception
    assert at.multiselect(key="build_precisions").value == ["fp32", "fp16"]
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm86", "TensorRT-RTX sm89"]).run()
    matrix = _frame(at, "target", "fp32").set_index("target")
    assert matrix.loc["TensorRT-RTX sm86", "fp32"] == f"cached (engine {seeded.engine_id})"
    assert matrix.loc["TensorRT-RTX sm89", "fp16"] == "new build"
    profile = _frame(at, "input", "min", "opt", "max")
    assert profile.loc[0, "min"] == "1x3x32x32" and profile.loc[0, "max"] == "8x3x32x32"
    assert at.button(key="build_submit").label == "Submit 3 build(s)"
    at.button(key="build_submit").click().run()
    assert not at.exception
    with seeded.app.catalog.read() as session:
        jobs = session.exec(select(JobRecord).where(JobRecord.status == JobStatus.QUEUED)).all()
    cells = sorted((j.payload["targets"][0], j.payload["precision"]) for j in jobs)
    assert cells == [("sm86", "fp16"), ("sm89", "fp16"), ("sm89", "fp32")]
    successes = [str(s.value) for s in at.success]
    assert any("sm86 fp32: cached" in s for s in successes)
    assert sum("queued job" in s for s in successes) == 3
    matrix = _frame(at, "target", "fp32").set_index("target")
    assert matrix.loc["TensorRT-RTX sm89", "fp32"].startswith("queued (job ")
    # live progress: one card per queued job, each with a cancel button
    assert len(at.get("progress")) >= 3
    first = min(j.id or 0 for j in jobs)
    at.button(key=f"build_cancel_{first}").click().run()
    with seeded.app.catalog.read() as session:
        cancelled = session.get(JobRecord, first)
    assert cancelled is not None and cancelled.status == JobStatus.CANCELLED


def test_build_int8_without_calibration_says_why(seeded: Seeded) -> None:
    at = _view("build").run()
    at.multiselect(key="build_precisions").set_value(["int8"]).run()
    assert any("needs calibration data" in e.value for e in at.error)
    assert at.button(key="build_submit").disabled


def test_engines_filter_detail_verify_and_check(seeded: Seeded) -> None:
    at = _view("engines").run()
    assert not at.exception
    table = _frame(at, "id", "sha256", "created")
    assert table["id"].tolist() == [seeded.engine_id]
    engine = seeded.app.catalog.read().__enter__().get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.sha256 is not None
    text = _texts(at)
    assert engine.sha256 in text and engine.cache_key in text
    ingredients = _frame(at, "ingredient", "value")
    assert ingredients["ingredient"].tolist()[:2] == ["schema", "onnx_digest"]
    assert engine.onnx_digest in ingredients.set_index("ingredient").loc["onnx_digest", "value"]
    at.button(key="engines_verify").click().run()
    assert any(f"sha256 {engine.sha256} matches" in str(s.value) for s in at.success)
    at.button(key="engines_check").click().run()
    verdict = next(m.value for m in at.markdown if "gpu-box-1" in m.value)
    assert "(online)" in verdict and ("**compatible**" in verdict or "**incompatible**" in verdict)
    assert "built for sm86 with tensorrt_rtx" in verdict
    # filters run in SQL: a precision with no engines empties the page
    at.selectbox(key="engines_f_precision").set_value("fp32").run()
    assert _frame(at, "id", "sha256", "created")["id"].tolist() == [seeded.engine_id]
    at.selectbox(key="engines_f_status").set_value("READY").run()
    assert "1 engine(s) match" in _texts(at)


def test_engines_verify_reports_a_corrupt_blob(seeded: Seeded) -> None:
    engine = seeded.app.catalog.read().__enter__().get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.blob_path is not None
    blob = seeded.app.home / engine.blob_path
    blob.chmod(0o644)
    blob.write_bytes(b"tampered")
    at = _view("engines").run()
    at.button(key="engines_verify").click().run()
    assert any("CORRUPT" in e.value for e in at.error)
    with seeded.app.catalog.read() as session:
        row = session.get(EngineRecord, seeded.engine_id)
    assert row is not None and row.status == EngineStatus.CORRUPT


def test_engines_why_miss_diffs_key_fields_and_retire(seeded: Seeded) -> None:
    at = _view("engines").run()
    at.radio(key="engines_miss_mode").set_value("a build request").run()
    at.selectbox(key="engines_miss_target").set_value("TensorRT-RTX sm89").run()
    diff = _frame(at, "field")
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
    at = _view("engines").run()
    at.button(key="engines_testload").click().run()
    assert not at.error, [e.value for e in at.error]
    with seeded.app.catalog.read() as session:
        job = session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).one()
    assert job.payload["engine_id"] == seeded.engine_id
    assert any(f"job {job.id}" in str(s.value) for s in at.success)


def _engine_view(engine_id: int) -> AppTest:
    script = f"import streamlit as st\nfrom dashboard.views import engines\nst.query_params['engine'] = '{engine_id}'\n"
    return AppTest.from_string(script + "engines.render()\n", default_timeout=TIMEOUT)


def test_engines_show_test_load_results(seeded: Seeded) -> None:
    from enginecache.service.testload import run_test_load

    ort = build_engine(seeded.app, BuildRequest(model="convnet", backend="ort")).engine
    run = run_test_load(seeded.app, ort.id or 0, iterations=15)
    assert run.verdict == "PASS"
    at = _engine_view(ort.id or 0).run()
    assert not at.exception
    assert any("**PASS**" in str(s.value) for s in at.success)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["p50 latency"].endswith(" ms") and metrics["throughput"].endswith("/s")
    accuracy = _frame(at, "name", "cosine", "max_abs")
    assert list(accuracy["name"]) == ["output"] and list(accuracy["passed"]) == ["True"]
    runs = _frame(at, "verdict", "load ms")
    assert list(runs["verdict"]) == ["PASS"]
    chart_keys = {c.proto.id for c in at.get("plotly_chart")}
    assert len(chart_keys) >= 2, "phases bar and latency histogram"

    rtx = run_test_load(seeded.app, seeded.engine_id, iterations=5)
    assert rtx.verdict == "INCOMPATIBLE"
    at = _engine_view(seeded.engine_id).run()
    assert any("**INCOMPATIBLE**" in str(e.value) and "TensorRT-RTX" in str(e.value) for e in at.error), [
        e.value for e in at.error
    ]


def test_timings_charts_come_from_aggregates(seeded: Seeded) -> None:
    at = _view("timings").run()
    assert not at.exception
    table = _frame(at, "mean build s", "engines")
    assert table.loc[0, "model"] == "convnet" and table.loc[0, "engines"] == 1
    assert table.loc[0, "target"] == "rtx sm86"
    assert len(at.get("plotly_chart")) >= 2


def test_timings_and_hosts_say_what_is_missing_on_an_empty_catalog(catalog: AppContext) -> None:
    at = _view("timings").run()
    assert not at.exception and "No engines built yet" in at.info[0].value
    at = _view("hosts").run()
    assert not at.exception and "No worker has registered yet" in at.info[0].value
    at = _view("overview").run()
    assert not at.exception and {m.label: m.value for m in at.metric}["Engines"] == "0"


def test_hosts_shows_fingerprint_heartbeat_and_capabilities(seeded: Seeded) -> None:
    at = _view("hosts").run()
    assert not at.exception
    table = _frame(at, "worker", "can build")
    assert table.loc[0, "worker"] == "worker-a" and table.loc[0, "host"] == "gpu-box-1"
    assert bool(table.loc[0, "online"]) is True
    assert "rtx: any of sm75" in table.loc[0, "can build"]
    assert "s ago" in table.loc[0, "last heartbeat"]


def test_stats_engine_page_filters_by_whole_target(seeded: Seeded) -> None:
    page = stats.engine_page(seeded.app, stats.EngineFilter(target="sm8"))
    assert page.total == 0
    page = stats.engine_page(seeded.app, stats.EngineFilter(target="sm86"))
    assert [r.id for r in page.rows] == [seeded.engine_id]
