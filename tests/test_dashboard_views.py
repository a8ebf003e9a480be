"""The dashboard's read views under Streamlit's AppTest (router, Overview, Models with uploads,
Timings, Hosts) on a real SQLite catalog in a temp dir. Build and Engines, the views that write,
are in test_dashboard_build_engines.py."""

from __future__ import annotations

import io
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from enginecache.dashboard.views import overview
from enginecache.db.models import ModelRecord
from enginecache.service.context import AppContext
from tests.dashboardkit import Seeded, frame, plain, router, served_catalog, texts, view
from tests.modelfactory import make_external_data_model, make_mlp


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    """An empty catalog."""
    with served_catalog(tmp_path / "home", monkeypatch) as ctx:
        yield ctx


def test_router_serves_the_overview_first(seeded: Seeded) -> None:
    at = router().run()
    assert not at.exception
    assert at.title[0].value == "Overview"


FIRST_VIEW_IMPORTS = (
    "import json, sys\n"
    "from streamlit.testing.v1 import AppTest\n"
    "at = AppTest.from_file(sys.argv[1], default_timeout=60).run()\n"
    "assert not at.exception, at.exception\n"
    "print(json.dumps({'title': at.title[0].value, 'pandas': 'pandas' in sys.modules}))\n"
)


@pytest.mark.slow
def test_the_first_view_of_a_new_server_process_imports_no_pandas(seeded: Seeded) -> None:
    """A new process's first page (Overview, status tables included) renders without pandas, half a
    second of a first render (docs/performance.md); the views with real tables import it when opened."""
    import json
    import subprocess
    import sys

    from enginecache.dashboard import app

    run = subprocess.run(
        [sys.executable, "-c", FIRST_VIEW_IMPORTS, app.__file__], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == {"title": "Overview", "pandas": False}


def test_overview_shows_counts_failures_and_activity(seeded: Seeded) -> None:
    at = view("overview").run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Models"] == "1"
    assert metrics["Engines"] == "1"
    assert metrics["Jobs"] == "1"
    assert metrics["Workers online"] == "1"
    tables = [m.value for m in at.markdown if m.value.startswith(overview.STATUS_TABLE_HEAD)]
    assert len(tables) == 2, "engines by status, jobs by status"
    assert "| :green-badge[READY] | 1 |" in tables[0].splitlines()
    assert "| :red-badge[FAILED] | 1 |" in tables[1].splitlines()
    # each failure once, its whole reason as plain text (no longer a table that cuts it off)
    assert any(f"**job {seeded.failed_job_id}** · FAILED" in m.value for m in at.markdown)
    assert any("calibration data does not match" in t.value for t in at.text)
    assert len(at.get("plotly_chart")) == 1  # cache activity: one build today


def test_models_lists_and_details_dynamic_dims_ops_and_lineage(seeded: Seeded) -> None:
    at = view("models").run()
    assert not at.exception
    table = frame(at, "name", "kind", "engines")
    assert table["name"].tolist() == ["convnet"]
    inputs = frame(at, "dynamic dims")
    assert inputs.loc[0, "name"] == "input"
    assert inputs.loc[0, "dynamic dims"] == "batch"
    assert inputs.loc[0, "shape"] == "batch x 3 x 32 x 32"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Opset"] == "17"
    assert metrics["Parameters"] == f"{8 * 3 * 3 * 3 + 8 + 8 * 10:,d}"
    with seeded.app.catalog.read() as session:
        model = session.get(ModelRecord, seeded.model_id)
    assert model is not None and model.digest in texts(at)
    lineage = frame(at, "built from", "newest engine")
    assert lineage.loc[0, "precision"] == "fp32" and lineage.loc[0, "newest engine"] == seeded.engine_id
    assert len(at.get("plotly_chart")) == 1  # op histogram


def test_models_upload_registers_an_onnx_with_external_data(catalog: AppContext, tmp_path: Path) -> None:
    model_file = make_external_data_model(tmp_path / "ext")
    at = view("models").run()
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
    assert any("Registered: uploaded-ext" in plain(s.value) for s in at.success)
    assert frame(at, "name", "kind", "engines")["name"].tolist() == ["uploaded-ext"]
    with catalog.catalog.read() as session:
        stored = session.exec(select(ModelRecord)).one()
    assert stored.info["external_data_files"] == ["ext.onnx.data"]


def test_models_upload_of_a_zip_folder_is_extracted_and_registered(catalog: AppContext, tmp_path: Path) -> None:
    model_file = make_mlp(tmp_path / "m" / "mlp.onnx")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.write(model_file, "folder/mlp.onnx")
    at = view("models").run()
    at.get("file_uploader")[0].upload("model.zip", buffer.getvalue()).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.error, [e.value for e in at.error]
    assert frame(at, "name", "kind", "engines")["name"].tolist() == ["mlp"]


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
    at = view("models").run()
    at.get("file_uploader")[0].upload(name, content).run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    assert len(at.error) == 1
    assert "upload rejected" in at.error[0].value and reason in plain(at.error[0].value)
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
        at = view("models").run()
        at.get("file_uploader")[0].upload(name, content).run()
        at.button(key="models_upload_submit").click().run()
        assert len(at.error) == 1 and reason in plain(at.error[0].value), (name, [e.value for e in at.error])
    assert _store_is_empty(catalog)
    assert not (tmp_path / "evil.onnx").exists()


def test_timings_charts_come_from_aggregates(seeded: Seeded) -> None:
    at = view("timings").run()
    assert not at.exception
    table = frame(at, "mean build s", "engines")
    assert table.loc[0, "model"] == "convnet" and table.loc[0, "engines"] == 1
    assert table.loc[0, "target"] == "rtx sm86"
    assert len(at.get("plotly_chart")) >= 2


def test_timings_and_hosts_say_what_is_missing_on_an_empty_catalog(catalog: AppContext) -> None:
    at = view("timings").run()
    assert not at.exception and "No engines built yet" in at.info[0].value
    at = view("hosts").run()
    assert not at.exception and "No worker has registered yet" in at.info[0].value
    at = view("overview").run()
    assert not at.exception and {m.label: m.value for m in at.metric}["Engines"] == "0"


def test_hosts_shows_fingerprint_heartbeat_and_capabilities(seeded: Seeded) -> None:
    at = view("hosts").run()
    assert not at.exception
    table = frame(at, "worker", "can build")
    assert table.loc[0, "worker"] == "worker-a" and table.loc[0, "host"] == "gpu-box-1"
    assert bool(table.loc[0, "online"]) is True
    assert "rtx: any of sm75" in table.loc[0, "can build"]
    assert "s ago" in table.loc[0, "last heartbeat"]
