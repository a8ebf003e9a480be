"""The dashboard's honest states (issue 12): what no worker can run is a warning naming what is
missing, with Cancel; a failed test-load shows on its engine with the reason; retire and verify
are shown in the state they produced; a FAILED engine offers only what can work for it."""

from __future__ import annotations

import re

from streamlit.testing.v1 import AppTest

from enginecache.db.models import EngineRecord, JobRecord, JobStatus, utcnow
from enginecache.service.builds.testload import submit_test_load
from enginecache.service.engines.views import download_name
from tests.conftest import corrupt_blob
from tests.dashboardkit import Seeded, add_failed_build, engine_view, plain, texts


def _status(at: AppTest) -> str:
    return str({m.label: m.value for m in at.metric}["Status"])


def test_a_test_load_no_worker_can_run_is_a_warning_with_cancel_also_after_a_reload(seeded: Seeded) -> None:
    # queued elsewhere (the CLI's --queue): the page's own button is off while nobody can run it
    job = submit_test_load(seeded.app, seeded.engine_id)
    at = engine_view(seeded.engine_id).run()
    assert not at.exception
    assert not at.success, "nothing was achieved yet: no green box"
    [warning] = [plain(w.value) for w in at.warning]
    assert f"Test-load job {job.id} is queued, but no live worker can run it" in warning
    assert re.search(r"needs a worker with TensorRT-RTX \S+ and an SM86 GPU on \w+", warning), warning
    fresh = engine_view(seeded.engine_id).run()  # a reload: the job is read from the catalog
    assert any(f"job {job.id}" in w.value for w in fresh.warning)
    fresh.button(key=f"engines_cancel_{job.id}").click().run()
    with seeded.app.catalog.read() as session:
        cancelled = session.get(JobRecord, job.id)
    assert cancelled is not None and cancelled.status == JobStatus.CANCELLED
    assert not fresh.warning and any(f"test-load job {job.id}: CANCELLED" in plain(s.value) for s in fresh.success)


def test_a_failed_test_load_shows_on_its_engine_with_the_reason(seeded: Seeded) -> None:
    job = submit_test_load(seeded.app, seeded.engine_id)
    with seeded.app.catalog.write() as session:
        row = session.get(JobRecord, job.id)
        assert row is not None
        row.status, row.error, row.finished_at = JobStatus.DEAD, "attempt 2 of 2: worker lost", utcnow()
        session.add(row)
    at = engine_view(seeded.engine_id).run()
    assert any(f"Test-load job {job.id} DEAD: attempt 2 of 2: worker lost" in plain(e.value) for e in at.error)
    assert "No test-load yet" not in texts(at)


def test_retire_is_shown_in_the_state_it_produced(seeded: Seeded) -> None:
    at = engine_view(seeded.engine_id).run()
    at.button(key="engines_retire").click().run()
    assert at.button(key="engines_retire").label == "Confirm retire"
    at.button(key="engines_retire").click().run()
    assert not at.exception
    assert _status(at) == "RETIRED"
    assert any(f"engine {seeded.engine_id} retired" in plain(s.value) for s in at.success)
    retire = at.button(key="engines_retire")
    assert retire.label == "Retire" and retire.disabled, "nothing left to retire"
    assert not at.warning, "no confirmation asked again"


def test_verify_is_shown_beside_the_status_it_produced(seeded: Seeded) -> None:
    with seeded.app.catalog.read() as session:
        engine = session.get(EngineRecord, seeded.engine_id)
    assert engine is not None and engine.blob_path is not None
    at = engine_view(seeded.engine_id).run()
    assert _status(at) == "READY"
    corrupt_blob(seeded.app.home / engine.blob_path)
    at.button(key="engines_verify").click().run()
    assert _status(at) == "CORRUPT" and any("CORRUPT" in e.value for e in at.error)


def test_a_failed_engine_shows_its_jobs_log_and_offers_nothing_that_cannot_work(seeded: Seeded) -> None:
    log_tail = "[builder] parsing convnet\n[builder] error: no implementation for layer conv"
    with seeded.app.catalog.write() as session:
        _, failed = add_failed_build(
            session, seeded.model_id, "the builder refused the network", "f" * 64, log_tail=log_tail
        )
    at = engine_view(failed.id or 0).run()
    assert not at.exception
    assert _status(at) == "FAILED"
    assert any("no implementation for layer conv" in c.value for c in at.code), "the job's log tail"
    assert at.button(key="engines_check").disabled
    assert at.button(key="engines_retire").disabled
    assert at.button(key="engines_testload").disabled and at.button(key="engines_verify").disabled


def test_a_downloaded_engine_is_named_with_its_backends_suffix() -> None:
    ort = EngineRecord(
        model_id=1, backend="ort", backend_version="1", precision="fp32", targets="x86_64-avx2", cache_key="k"
    )
    rtx = EngineRecord(model_id=1, backend="rtx", backend_version="1", precision="fp16", targets="sm86", cache_key="k")
    assert download_name(ort, "convnet") == "convnet.fp32.x86_64-avx2.ort"
    assert download_name(rtx, "convnet").endswith(".fp16.sm86.plan")
