"""The coverage matrix (issue 12, point 4): models x targets x precisions, each cell READY, BUILT
(built, no host of this class seen yet: issue 28, point 2), INCOMPATIBLE (incompatible with every host
seen), STALE, BUILDING, FAILED or MISSING from the catalog (the compatibility verdict is the
backend's one rule on each worker's recorded fingerprint), in colour and in words; one click builds
the missing and stale cells through `submit_build`; the filters are in the URL; the Hosts page says
what each host can load and which READY engines it lacks.

The workers are given recorded fingerprints of their own (a GPU host with an SM86 GPU), so the
verdicts do not depend on the machine running the tests."""

from __future__ import annotations

import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sqlmodel import delete, select
from streamlit.testing.v1 import AppTest

from enginecache.core.fingerprint import host_fingerprint
from enginecache.dashboard import app as dashboard_app
from enginecache.dashboard import live
from enginecache.dashboard.views import coverage as coverage_view
from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus, WorkerRecord, utcnow
from enginecache.service.access.roles import Role, set_role
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.engines.groups import not_older
from enginecache.service.engines.records import engine_host_verdicts, get_engine, retire_engine
from enginecache.service.fleet import coverage, hostcoverage
from enginecache.service.jobs.routing import worker_capabilities
from enginecache.service.models.register import register_model
from tests.dashboardkit import TIMEOUT, Seeded, frame, plain, queued_jobs, serve_home, texts, view
from tests.modelfactory import make_mlp
from tests.test_dashboard_login import AUTH

SM86, SM80, SM89, SM120 = (f"TensorRT-RTX {t}" for t in ("sm86", "sm80", "sm89", "sm120"))


def _gpu_host(app: AppContext, *, name: str, hostname: str, cc: str, rtx: str) -> None:
    """Worker `name` recorded as a Linux host with one NVIDIA GPU of `cc` and TensorRT-RTX `rtx`."""
    host = host_fingerprint().to_dict()
    host.update(
        hostname=hostname,
        os="Linux",
        gpus=[
            {"index": 0, "name": "RTX A6000", "uuid": f"GPU-{name}", "compute_capability": cc, "memory_total_bytes": 1}
        ],
        packages={**host["packages"], "tensorrt_rtx": rtx},
        nvml="ok",
    )
    caps = worker_capabilities(host_fingerprint())
    caps.update(
        backends=["rtx", "ort"],
        versions={**caps["versions"], "rtx": rtx},
        gpus=[{"name": "RTX A6000", "compute_capability": cc}],
    )
    with app.catalog.read() as session:
        known = session.exec(select(WorkerRecord).where(WorkerRecord.name == name)).first() is not None
    if not known:
        queue.register_worker(app.catalog, name=name, hostname=hostname, pid=1, fingerprint=host, capabilities=caps)
        return
    with app.catalog.write() as session:
        row = session.exec(select(WorkerRecord).where(WorkerRecord.name == name)).one()
        row.fingerprint, row.capabilities, row.hostname = host, caps, hostname
        session.add(row)


def _engine_like(app: AppContext, engine_id: int, **fields: Any) -> int:
    """A catalog row like engine `engine_id` with `fields` changed (no blob needed for the matrix)."""
    base = get_engine(app, engine_id)
    data = base.model_dump(exclude={"id", "created_at"})
    data.update(cache_key=f"{base.cache_key[:40]}{len(str(fields)):04d}{abs(hash(str(fields))) % 10**20:020d}")
    data.update(fields)
    with app.catalog.write() as session:
        row = EngineRecord(**data)
        session.add(row)
        session.flush()
        return int(row.id or 0)


def _version(seeded: Seeded) -> str:
    return get_engine(seeded.app, seeded.engine_id).backend_version


def _rtx_view(*params: str) -> AppTest:
    """The Coverage view opened from a link with these query parameters."""
    lines = [f"st.query_params[{p.split('=')[0]!r}] = {p.split('=', 1)[1]!r}" for p in params]
    script = "import streamlit as st\nfrom enginecache.dashboard.views import coverage\n"
    script += "".join(f"{line}\n" for line in lines) + "coverage.render()\n"
    return AppTest.from_string(script, default_timeout=TIMEOUT)


def _matrix(at: AppTest) -> pd.DataFrame:
    table = frame(at, "model", "precision")
    table.columns = [str(c).split(" (")[0] for c in table.columns]  # "TensorRT-RTX sm86 (1 host)" -> the target
    return table.set_index(["model", "precision"])


@pytest.fixture
def fleet(seeded: Seeded) -> Seeded:
    """worker-a: an SM86 GPU host running TensorRT-RTX at the seeded engine's version."""
    _gpu_host(seeded.app, name="worker-a", hostname="gpu-box-1", cc="sm86", rtx=_version(seeded))
    return seeded


def test_coverage_without_models_says_what_to_do(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    serve_home(tmp_path / "home", monkeypatch)
    AppContext.from_settings(tmp_path / "home").close()
    at = view("coverage").run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Coverage"]
    assert "No models yet" in texts(at)
    assert not at.dataframe and not at.button


def test_every_state_is_read_from_the_catalog_in_words_and_colour(fleet: Seeded) -> None:
    app, version = fleet.app, _version(fleet)
    failed = _engine_like(app, fleet.engine_id, precision="fp16", targets="sm89", status=EngineStatus.FAILED,
                          sha256=None, error="builder ran out of memory")  # fmt: skip
    stale = _engine_like(app, fleet.engine_id, precision="fp16", targets="sm86", backend_version="1.6.0")
    nobody = _engine_like(app, fleet.engine_id, targets="sm120")
    retired = _engine_like(app, fleet.engine_id, targets="sm75")
    retire_engine(app, retired)
    job = submit_build(app, BuildRequest(model=str(fleet.model_id), backend="rtx", targets=("sm80",))).job
    assert job is not None

    at = _rtx_view("backend=rtx", "targets=all").run()
    assert not at.exception, at.exception
    matrix = _matrix(at)
    row32, row16 = matrix.loc[("convnet", "fp32")], matrix.loc[("convnet", "fp16")]
    assert row32[SM86] == f"READY · engine {fleet.engine_id}"
    assert row32[SM120] == f"BUILT · engine {nobody}", "no sm120 host is known: built, not incompatible"
    assert row32[SM80] == f"BUILDING · job {job.id}"
    assert row32["TensorRT-RTX sm75"] == "MISSING", "a retired engine is no engine"
    assert row16[SM86] == f"STALE · engine {stale}"
    assert row16[SM89] == f"FAILED · engine {failed}"
    assert row16[SM80] == "MISSING"
    # why, in words: the build error, the versions, the rule's refusal (from the backend's one rule)
    why = plain(texts(at))
    line = f"convnet fp16 TensorRT-RTX sm89 (no host): FAILED ([engine {failed}](engines?engine={failed}))"
    assert f"{line}, builder ran out of memory" in why
    assert f"built with TensorRT-RTX 1.6.0; the fleet runs {version}" in why
    assert f"BUILT ([engine {nobody}](engines?engine={nobody})), built, no host of this class seen yet" in why
    assert "was retired" not in why, "missing cells are not listed"
    # the counts add up, and name the fleet's libraries
    assert "READY 1 · BUILT 1 · INCOMPATIBLE 0 · STALE 1 · BUILDING 1 · FAILED 1 · MISSING 7" in texts(at)
    assert "the fleet's newest libraries: ONNX Runtime" in plain(texts(at)) and f"TensorRT-RTX {version}" in plain(
        texts(at)
    )
    # the colour is the state's, and only a state's word gets one
    assert coverage_view._style(f"FAILED · engine {failed}") == "background-color: #ffcdd2; color: #b71c1c"
    assert coverage_view._style("convnet") == ""
    assert len({coverage_view._style(state) for state in coverage.STATES}) == len(coverage.STATES)


def _cpu_host(app: AppContext) -> None:
    """worker-a recorded as a host with no GPU that runs TensorRT-RTX and ONNX Runtime (a build box)."""
    host = host_fingerprint().to_dict()
    host.update(hostname="cpu-box-1", os="Linux", gpus=[], nvml="no NVIDIA driver")
    caps = worker_capabilities(host_fingerprint())
    caps.update(backends=["rtx", "ort"], gpus=[])
    with app.catalog.write() as session:
        row = session.exec(select(WorkerRecord).where(WorkerRecord.name == "worker-a")).one()
        row.fingerprint, row.capabilities, row.hostname = host, caps, "cpu-box-1"
        session.add(row)


def test_an_engine_built_ahead_of_time_for_a_class_no_host_has_is_built_not_incompatible(seeded: Seeded) -> None:
    """Issue 28, point 2: the catalog has seen only a CPU host, so every fresh TensorRT-RTX engine was
    INCOMPATIBLE (purple), which read as 'your builds are broken'; it is BUILT, in words and colour."""
    _cpu_host(seeded.app)
    matrix = coverage.coverage(seeded.app, backends=["rtx"], precisions=["fp32"])
    [sm86] = [c for c in matrix.columns if c.target == "sm86"]
    cell = matrix.cell(seeded.model_id, "fp32", sm86)
    assert cell is not None and sm86.hosts == ()
    assert (cell.state, cell.text) == (coverage.BUILT, f"BUILT · engine {seeded.engine_id}")
    assert cell.reason == "built, no host of this class seen yet (1 known host(s), none with sm86)"
    assert matrix.counts()[coverage.INCOMPATIBLE] == 0

    at = _rtx_view("backend=rtx", "precision=fp32").run()
    assert not at.exception, at.exception
    assert _matrix(at).loc[("convnet", "fp32")][SM86] == f"BUILT · engine {seeded.engine_id}"
    assert "READY 0 · BUILT 1 · INCOMPATIBLE 0 · STALE 0" in texts(at)
    legend = frame(at, "state", "means")
    means = dict(zip(legend["state"], legend["means"], strict=True))
    assert means[coverage.BUILT].startswith("built, no host of this class seen yet")
    assert means[coverage.INCOMPATIBLE].startswith("incompatible with every host seen")
    built, incompatible = (
        coverage_view._style(f"{state} · engine 1") for state in (coverage.BUILT, coverage.INCOMPATIBLE)
    )
    assert built and built != incompatible, "a colour of its own, not INCOMPATIBLE's purple"

    with seeded.app.catalog.write() as session:  # no host known at all: still built, not READY
        session.exec(delete(WorkerRecord))
    nobody = coverage.coverage(seeded.app, backends=["rtx"], precisions=["fp32"])
    [cell] = [c for c in nobody.cells if c.column.target == "sm86"]
    assert (cell.state, cell.reason) == (coverage.BUILT, "built, no host of this class seen yet (no host known yet)")


def test_incompatible_means_every_host_seen_refuses_an_engine_of_a_class_the_fleet_has(fleet: Seeded) -> None:
    """An SM86 host is known (worker-a) and refuses the engine (another TensorRT-RTX version): INCOMPATIBLE,
    with the rule's reason; the SM120 engine, of a class no host has, stays BUILT."""
    app = fleet.app
    refused = _engine_like(app, fleet.engine_id, precision="fp16", backend_version="99.0")
    unseen = _engine_like(app, fleet.engine_id, targets="sm120")
    matrix = coverage.coverage(app, backends=["rtx"], every_target=True)
    cells = {(c.precision, c.column.target): c for c in matrix.cells}
    cell = cells[("fp16", "sm86")]
    assert (cell.state, cell.engine_id) == (coverage.INCOMPATIBLE, refused)
    [rule] = [v.reason for v in engine_host_verdicts(app, refused)]
    assert "99.0" in rule and cell.reason == f"incompatible with every host seen: {rule}"
    assert (cells[("fp32", "sm120")].state, cells[("fp32", "sm120")].engine_id) == (coverage.BUILT, unseen)
    assert cells[("fp32", "sm86")].state == coverage.READY


def test_by_default_the_columns_are_the_targets_in_use(fleet: Seeded) -> None:
    at = _rtx_view("precision=fp32").run()
    assert not at.exception, at.exception
    columns = list(_matrix(at).columns)
    cpu = [c for c in columns if c.startswith("ONNX Runtime")]
    assert columns == [SM86, *cpu] and len(cpu) == 1, "the host's GPU and CPU: nothing else is in use"
    assert frame(at, "model", "precision").columns[2] == f"{SM86} (1 host)"
    at.toggle(key="coverage_every").set_value(True).run()
    assert at.query_params["targets"] == "all"
    assert [c for c in _matrix(at).columns if c.startswith("TensorRT-RTX")] == [
        f"TensorRT-RTX {t}" for t in ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")
    ]
    # the legend: every state in words, beside what it means
    legend = frame(at, "state", "means")
    assert list(legend["state"]) == list(coverage.STATES)


def test_staleness_follows_the_newest_version_the_fleet_reports(fleet: Seeded) -> None:
    version = _version(fleet)
    newer = version.rsplit(".", 1)[0] + ".999"
    _gpu_host(fleet.app, name="worker-b", hostname="gpu-box-2", cc="sm86", rtx=newer)
    assert coverage.fleet_versions(fleet.app)["rtx"] == newer
    at = _rtx_view("backend=rtx", "precision=fp32").run()
    assert _matrix(at).loc[("convnet", "fp32"), SM86] == f"STALE · engine {fleet.engine_id}"
    assert f"the fleet runs {newer}" in plain(texts(at))
    assert coverage.version_key("1.10.0") > coverage.version_key("1.9.2") > coverage.version_key("1.9")
    assert not_older("1.7.1", "1.7.1.116") and not_older("1.7.1.116", "1.7.1.116"), "a header proves 3 parts"
    assert not not_older("1.7.0", "1.7.1.116") and not not_older("1.6", "1.7.1")


def test_one_click_builds_the_missing_and_stale_cells_through_submit_build(fleet: Seeded) -> None:
    stale = _engine_like(fleet.app, fleet.engine_id, targets="sm89", backend_version="1.6.0")
    at = _rtx_view("backend=rtx", "precision=fp32", "targets=all").run()
    button = at.button(key="coverage_build")
    # sm75, sm80, sm120, sm121 missing, sm89 stale; sm86 READY
    assert button.label == "Build 5 missing or stale cell(s)" and not button.disabled
    button.click().run()
    assert not at.exception, at.exception
    jobs = queued_jobs(fleet.app)
    assert sorted(j.payload["targets"][0] for j in jobs) == ["sm120", "sm121", "sm75", "sm80", "sm89"]
    assert {j.payload["precision"] for j in jobs} == {"fp32"}
    assert len([s for s in at.success if "queued job" in str(s.value)]) == 5
    matrix = _matrix(at)
    assert matrix.loc[("convnet", "fp32"), "TensorRT-RTX sm89"].startswith("BUILDING · job ")
    assert at.button(key="coverage_build").disabled, "nothing left to build"
    assert stale not in [j.result_engine_id for j in jobs]


def test_quantized_cells_wait_for_calibration_data_then_build_with_it(fleet: Seeded) -> None:
    at = _rtx_view("backend=rtx", "precision=int8", "targets=all").run()
    assert at.button(key="coverage_build").disabled
    assert "6 int8/fp8 cell(s) need calibration data" in texts(at)
    buffer = io.BytesIO()
    np.savez(buffer, input=np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32))
    at.get("file_uploader")[0].upload("calib.npz", buffer.getvalue()).run()
    button = at.button(key="coverage_build")
    assert button.label == "Build 6 missing or stale cell(s)" and not button.disabled
    button.click().run()
    assert not at.exception, at.exception
    jobs = queued_jobs(fleet.app)
    assert len(jobs) == 6 and all(j.payload["precision"] == "int8" and j.payload["calibration"] for j in jobs)


def test_a_viewer_sees_the_matrix_but_cannot_build(fleet: Seeded) -> None:
    script = (
        "import streamlit as st\nfrom enginecache.dashboard.views import coverage\n"
        "st.session_state['enginecache_role'] = 'viewer'\ncoverage.render()\n"
    )
    at = AppTest.from_string(script, default_timeout=TIMEOUT).run()
    assert not at.exception
    assert at.button(key="coverage_build").disabled
    assert coverage_view.BUILD_ROLE_CAPTION in [c.value for c in at.caption]
    assert _matrix(at).loc[("convnet", "fp32"), SM86].startswith("READY")


def test_a_link_with_filters_reproduces_the_view(fleet: Seeded) -> None:
    at = _rtx_view(f"model={fleet.model_id}", "backend=ort", "precision=fp16,int8").run()
    assert at.multiselect(key="coverage_models").value == [fleet.model_id]
    assert at.multiselect(key="coverage_backends").value == ["ort"]
    assert at.multiselect(key="coverage_precisions").value == ["fp16", "int8"]
    matrix = _matrix(at)
    assert list(matrix.index.get_level_values("precision")) == ["fp16", "int8"]
    assert all(c.startswith("ONNX Runtime") for c in matrix.columns)
    # a filter changed here goes back into the URL; the default precisions leave it
    at.multiselect(key="coverage_precisions").set_value(["fp32", "fp16"]).run()
    assert "precision" not in at.query_params and at.query_params["backend"] == "ort"
    # a value that names nothing is left out, not an error
    bad = _rtx_view("model=999", "precision=fp64").run()
    assert not bad.exception and bad.multiselect(key="coverage_precisions").value == ["fp32", "fp16"]


def test_the_matrix_redraws_itself_while_a_job_runs_and_turns_ready(fleet: Seeded, intervals: dict[str, Any]) -> None:
    at = _rtx_view("backend=rtx", "precision=fp16").run()
    assert intervals == {"live__matrix_section": None}, "nothing runs: no timer"
    job = submit_build(
        fleet.app, BuildRequest(model=str(fleet.model_id), backend="rtx", targets=("sm86",), precision="fp16")
    ).job
    assert job is not None
    at.run()
    assert intervals == {"live__matrix_section": live.REFRESH_SECONDS}
    assert _matrix(at).loc[("convnet", "fp16"), SM86] == f"BUILDING · job {job.id}"
    built = _engine_like(fleet.app, fleet.engine_id, precision="fp16")  # what the worker wrote
    with fleet.app.catalog.write() as session:
        row = session.get(JobRecord, job.id)
        assert row is not None
        row.status, row.finished_at, row.result_engine_id = JobStatus.SUCCEEDED, utcnow(), built
        session.add(row)
    at.run()
    assert _matrix(at).loc[("convnet", "fp16"), SM86] == f"READY · engine {built}"
    assert intervals == {"live__matrix_section": None}


def test_the_hosts_page_says_what_each_host_loads_and_lacks(fleet: Seeded) -> None:
    nobody = _engine_like(fleet.app, fleet.engine_id, targets="sm120", precision="fp16")
    at = view("hosts").run()
    assert not at.exception, at.exception
    loads = frame(at, "loads engine")
    assert list(loads["loads engine"]) == [fleet.engine_id]
    assert list(loads["model"]) == ["convnet"] and list(loads["precision"]) == ["fp32"]
    lacks = frame(at, "newest engine", "why")
    assert list(lacks["newest engine"]) == [nobody] and list(lacks["precision"]) == ["fp16"]
    assert "not among the engine's targets" in lacks["why"].iloc[0]
    table = frame(at, "worker", "loads", "lacks")
    assert list(table["loads"]) == [1] and list(table["lacks"]) == [1]


def test_host_coverage_uses_the_backends_one_rule(fleet: Seeded) -> None:
    [host] = coverage.known_hosts(coverage.worker_hosts(fleet.app))
    found = hostcoverage.host_coverage(fleet.app, host.fingerprint)
    [verdict] = engine_host_verdicts(fleet.app, fleet.engine_id)
    assert [(e.engine_id, e.verdict) for e in found.loadable] == [(fleet.engine_id, verdict.verdict)]
    assert found.loadable[0].reason == verdict.reason


def test_the_router_serves_coverage_at_its_own_path_and_reads_the_role_on_each_run(
    fleet: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert ("coverage", "Coverage", "coverage", ":material/grid_view:") in dashboard_app.VIEWS
    set_role(fleet.app, "viewer@example.com", Role.VIEWER)
    views = dashboard_app.VIEWS
    monkeypatch.setattr(dashboard_app, "VIEWS", tuple(sorted(views, key=lambda v: v[0] != "coverage")))
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": "viewer@example.com", "email_verified": True, "exp": time.time() + 3600}
    at.run()
    assert not at.exception and at.title[0].value == "Coverage"
    assert at.button(key="coverage_build").disabled, "a viewer may look, not build"
    set_role(fleet.app, "viewer@example.com", Role.OPERATOR)  # promoted: the next run reads it
    at.run()
    assert not at.button(key="coverage_build").disabled


def test_the_coverage_queries_run_on_each_catalog(catalog_ctx: AppContext, tmp_path: Path) -> None:
    """GROUP BY, the JSON path of the workers' library versions and DISTINCT, on SQLite and PostgreSQL."""
    app = catalog_ctx
    model = register_model(app, make_mlp(tmp_path / "mlp.onnx")).model
    built = build_engine(app, BuildRequest(model=str(model.id), backend="ort")).engine
    host = host_fingerprint()
    queue.register_worker(
        app.catalog, name="w", hostname="h", pid=1, fingerprint=host.to_dict(), capabilities=worker_capabilities(host)
    )
    assert coverage.fleet_versions(app)["ort"] == built.backend_version
    [group] = coverage.engine_groups(app)
    assert (group.model_id, group.backend, group.count, group.newest_id) == (model.id, "ort", 1, built.id)
    matrix = coverage.coverage(app, backends=("ort",), precisions=("fp32",))
    [cell] = matrix.cells
    assert (cell.state, cell.engine_id) == (coverage.READY, built.id)
    [found] = hostcoverage.hosts_coverage(app, coverage.worker_hosts(app)).values()
    assert [e.engine_id for e in found.loadable] == [built.id] and not found.lacking


@pytest.mark.usefixtures("no_modelopt")
def test_one_click_leaves_out_the_cells_this_install_cannot_make_and_says_why(fleet: Seeded) -> None:
    """Without ModelOpt no backend here makes bf16: its MISSING cells are not submitted (each would be
    refused when planned), and the caption names the extra; the fp32 cells still are."""
    at = _rtx_view("backend=rtx", "precision=fp32,bf16", "targets=all").run()
    button = at.button(key="coverage_build")
    assert any(str(c).startswith("MISSING") for c in _matrix(at).loc[("convnet", "bf16")])
    missing_fp32 = [c for c in _matrix(at).loc[("convnet", "fp32")] if str(c).startswith("MISSING")]
    assert button.label == f"Build {len(missing_fp32)} missing or stale cell(s)"
    captions = "\n".join(plain(c.value) for c in at.caption)
    assert "left out: this install cannot make them (bf16 for" in captions and "ModelOpt" in captions
    button.click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert {j.payload["precision"] for j in queued_jobs(fleet.app)} == {"fp32"}
