"""The dashboard's live state (issue 12): the Build view's matrix, its job list and each card read
the catalog (not the browser session), redraw themselves while anything runs, and are right in a
fresh session (a reload); buttons that can do nothing are disabled."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from streamlit.testing.v1 import AppTest

from enginecache.dashboard import live
from enginecache.dashboard.views.build import Target, make_request
from enginecache.db.models import EngineStatus, JobRecord, JobStatus, utcnow
from enginecache.service.builds.plan import BuildRequest, build_engine, plan_build
from enginecache.service.builds.submit import submit_build
from enginecache.service.builds.testload import submit_test_load
from tests.dashboardkit import Seeded, frame, queued_jobs, rtx_engine, view

SM89 = "TensorRT-RTX sm89"


def _build_view(targets: list[str], precisions: list[str], model_id: int) -> AppTest:
    at = view("build").run()
    at.multiselect(key="build_targets").set_value(targets).run()
    at.multiselect(key=f"build_precisions_{model_id}").set_value(precisions).run()
    assert not at.exception, at.exception
    return at


def _matrix(at: AppTest) -> Any:
    return frame(at, "target").set_index("target")


def _matrix_errors(at: AppTest) -> list[str]:
    """The errors the matrix shows (not the job list's failed jobs, the seeded one among them)."""
    return [str(e.value) for e in at.error if not str(e.value).startswith(("FAILED", "DEAD"))]


def _card_texts(at: AppTest) -> list[str]:
    return [str(m.value) for m in at.markdown] + [str(p.proto.text) for p in at.get("progress")]


def _submit(seeded: Seeded, precision: str, target: str = "sm89") -> JobRecord:
    request = BuildRequest(model=str(seeded.model_id), backend="rtx", targets=(target,), precision=precision)
    job = submit_build(seeded.app, request).job
    assert job is not None
    return job


def _finish(seeded: Seeded, job_id: int, status: JobStatus, **fields: Any) -> None:
    with seeded.app.catalog.write() as session:
        job = session.get(JobRecord, job_id)
        assert job is not None
        job.status = status
        job.finished_at = utcnow()
        for name, value in fields.items():
            setattr(job, name, value)
        session.add(job)


def test_the_job_list_reads_the_catalog_in_a_fresh_session(seeded: Seeded) -> None:
    built = _submit(seeded, "fp16")
    failed = _submit(seeded, "fp32")
    engine = build_engine(seeded.app, BuildRequest(model="convnet", backend="rtx", targets=("sm89",))).engine
    _finish(seeded, built.id or 0, JobStatus.SUCCEEDED, result_engine_id=engine.id, phase="publish", progress=1.0)
    _finish(seeded, failed.id or 0, JobStatus.FAILED, error="builder ran out of memory", phase="claimed")
    test_load = submit_test_load(seeded.app, seeded.engine_id)

    at = view("build").run()  # a new session: nothing of the submissions is in it
    assert not at.exception
    cards = "\n".join(_card_texts(at))
    assert f"job {built.id} · build convnet · TensorRT\\-RTX fp16 sm89 · **SUCCEEDED**" in cards
    assert f"[engine {engine.id}](engines?engine={engine.id}) built" in cards, "the engine id links to its page"
    assert f"job {failed.id} · build convnet · TensorRT\\-RTX fp32 sm89 · **FAILED**" in cards
    assert f"job {test_load.id} · test\\-load engine {seeded.engine_id} of convnet" in cards
    assert "None" not in cards and "model " not in cards, "names, never a None or a bare model id"
    assert "claimed" not in cards and "publish" not in cards, "a finished job shows no last phase"
    assert not at.get("progress"), "no progress bar on a queued or finished job"
    assert any("builder ran out of memory" in e.value and "FAILED" in e.value for e in at.error)
    # the queued test-load no live worker can run: a warning naming what is missing, and a Cancel
    assert any("needs a worker with TensorRT\\-RTX" in w.value and "SM86" in w.value for w in at.warning)
    assert at.button(key=f"build_cancel_{test_load.id}")
    keys = {b.key for b in at.button}
    assert f"build_cancel_{built.id}" not in keys and f"build_cancel_{failed.id}" not in keys
    # filterable: only the failed ones
    at.multiselect(key="build_jobs_status").set_value(["FAILED"]).run()
    cards = "\n".join(_card_texts(at))
    assert f"job {failed.id} " in cards and f"job {built.id} " not in cards


def test_the_matrix_follows_the_catalog_and_submit_counts_what_it_submits(seeded: Seeded) -> None:
    at = _build_view([SM89], ["fp32"], seeded.model_id)
    assert _matrix(at).loc[SM89, "fp32"] == "new build"
    assert at.button(key="build_submit").label == "Submit 1 build(s)"
    at.button(key="build_submit").click().run()
    (job,) = queued_jobs(seeded.app)
    assert _matrix(at).loc[SM89, "fp32"] == f"queued (job {job.id})"
    submit = at.button(key="build_submit")
    assert submit.label == "Submit 0 build(s)" and submit.disabled, "nothing left to submit: disabled"
    # a worker finishes it: the matrix reads the engine from the catalog, not the session's job ids
    engine = build_engine(seeded.app, BuildRequest(model="convnet", backend="rtx", targets=("sm89",))).engine
    _finish(seeded, job.id or 0, JobStatus.SUCCEEDED, result_engine_id=engine.id)
    at.run()
    assert _matrix(at).loc[SM89, "fp32"] == f"cached (engine {engine.id})"
    assert at.button(key="build_submit").disabled


def test_a_cell_whose_build_failed_before_is_a_retry_with_its_reason(seeded: Seeded) -> None:
    target = Target("rtx", "sm89", SM89)
    plan = plan_build(seeded.app, make_request(seeded.model_id, target, "fp16", {}))
    with seeded.app.catalog.write() as session:
        failed = rtx_engine(
            seeded.model_id,
            plan.cache_key,
            backend_version=plan.backend_version,
            status=EngineStatus.FAILED,
            onnx_digest=plan.model.digest,
            error="the builder refused layer conv: no fp16 kernel",
        )
        session.add(failed)
    at = _build_view([SM89], ["fp16"], seeded.model_id)
    cell = _matrix(at).loc[SM89, "fp16"]
    assert cell.startswith("retry: failed before") and "no fp16 kernel" in cell
    assert at.button(key="build_submit").label == "Submit 1 build(s)"
    at.button(key="build_submit").click().run()
    jobs = queued_jobs(seeded.app)
    assert [j.payload["precision"] for j in jobs] == ["fp16"]


def _calibration() -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, input=np.random.default_rng(0).standard_normal((4, 3, 32, 32)).astype(np.float32))
    return buffer.getvalue()


def test_calibration_goes_to_the_int8_cells_only_so_one_submit_mixes_precisions(seeded: Seeded) -> None:
    at = _build_view([SM89], ["fp32", "fp16", "int8"], seeded.model_id)
    assert len(_matrix_errors(at)) == 1, "the int8 cell's reason, once"
    at.get("file_uploader")[0].upload("calib.npz", _calibration()).run()
    assert not at.exception
    assert not _matrix_errors(at)
    assert _matrix(at).loc[SM89].tolist() == ["new build", "new build", "new build"]
    at.button(key="build_submit").click().run()
    jobs = queued_jobs(seeded.app)
    calibrated = {j.payload["precision"]: j.payload["calibration"] for j in jobs}
    assert set(calibrated) == {"fp32", "fp16", "int8"}
    assert calibrated["fp32"] is None and calibrated["fp16"] is None and calibrated["int8"]


def test_an_error_is_listed_once_even_after_a_submit(seeded: Seeded) -> None:
    at = _build_view([SM89], ["fp32", "int8"], seeded.model_id)
    assert [e.count("needs calibration data") for e in _matrix_errors(at)] == [1]
    at.button(key="build_submit").click().run()
    assert [e.count("needs calibration data") for e in _matrix_errors(at)] == [1]
    assert [str(s.value).count("queued job") for s in at.success] == [1]


def test_the_matrix_and_the_job_list_redraw_themselves_while_a_job_runs(
    seeded: Seeded, intervals: dict[str, Any]
) -> None:
    at = _build_view([SM89], ["fp32"], seeded.model_id)
    assert intervals == {"live__job_list": None, "live__matrix_section": None}, "nothing runs: no timer"
    at.button(key="build_submit").click().run()
    assert intervals == {"live__job_list": live.REFRESH_SECONDS, "live__matrix_section": live.REFRESH_SECONDS}
    (job,) = queued_jobs(seeded.app)
    _finish(seeded, job.id or 0, JobStatus.CANCELLED)
    at.run()
    assert intervals == {"live__job_list": None, "live__matrix_section": None}
