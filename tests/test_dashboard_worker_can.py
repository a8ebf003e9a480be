"""Actions no worker can perform are disabled with the reason (issue 28, findings 8 and 9).

Test-load: the engine page's button is off, with what is missing under the buttons, while no live
worker (status online, heartbeat within its liveness lease, one that takes queued jobs) would claim
the engine's test-load by the rule workers claim by (`service.builds.whocan`); a click then never
leaves a job QUEUED for nobody. The seeded worker is this host (no GPU here): it runs ONNX Runtime
engines of its CPU, not the seeded TensorRT-RTX SM86 engine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlmodel import select

from enginecache.db import queue
from enginecache.db.models import WorkerRecord, utcnow
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.whocan import blocked_test_load
from enginecache.service.engines.records import get_engine
from enginecache.service.jobs.routing import can_run, load_requirements
from tests.dashboardkit import Seeded, engine_view, frame, plain, queued_jobs, view


@pytest.fixture
def ort_engine(seeded: Seeded) -> int:
    return int(build_engine(seeded.app, BuildRequest(model="convnet", backend="ort")).engine.id or 0)


def _captions(at: object) -> str:
    return "\n".join(plain(c.value) for c in at.caption)  # type: ignore[attr-defined]


@pytest.mark.usefixtures("requires_no_gpu")
def test_test_load_of_an_engine_no_live_worker_can_load_is_disabled_with_the_reason(seeded: Seeded) -> None:
    at = engine_view(seeded.engine_id).run()
    assert not at.exception, at.exception
    button = at.button(key="engines_testload")
    assert button.disabled, "no live worker has an SM86 GPU: the click would queue a job for nobody"
    captions = _captions(at)
    assert "Test-load is off: no live worker can load it: it needs a worker with TensorRT-RTX" in captions
    assert "an SM86 GPU" in captions and "enginecache worker" in captions
    assert "no live worker can load it" in str(button.help)
    assert queued_jobs(seeded.app) == []


def test_test_load_of_an_engine_a_live_worker_can_load_is_enabled(seeded: Seeded, ort_engine: int) -> None:
    at = engine_view(ort_engine).run()
    assert not at.button(key="engines_testload").disabled
    assert "Test-load is off" not in _captions(at)


def test_a_worker_whose_liveness_lease_ran_out_no_longer_counts(seeded: Seeded, ort_engine: int) -> None:
    assert blocked_test_load(seeded.app, ort_engine) is None
    with seeded.app.catalog.write() as session:
        for worker in session.exec(select(WorkerRecord)).all():
            worker.heartbeat_at = utcnow() - timedelta(days=30)  # far past any liveness window
            session.add(worker)
    at = engine_view(ort_engine).run()
    assert at.button(key="engines_testload").disabled
    assert "no live worker can load it: it needs a worker with ONNX Runtime" in _captions(at)


def test_a_one_shot_worker_never_counts_for_a_test_load(seeded: Seeded, ort_engine: int) -> None:
    """A CLI's one-shot worker claims only its own job: a page's test-load must not count on it."""
    with seeded.app.catalog.write() as session:
        for worker in session.exec(select(WorkerRecord)).all():
            worker.capabilities = {**worker.capabilities, "scope": "job"}
            session.add(worker)
    assert blocked_test_load(seeded.app, ort_engine) is not None


def test_the_answer_is_the_claim_rule(seeded: Seeded, ort_engine: int) -> None:
    """What `blocked_test_load` says is what a worker's claim decides: the job's requirements on the
    live worker's capabilities through `routing.can_run` (no second encoding of the rule)."""
    [worker] = queue.list_workers(seeded.app.catalog)
    answers = []
    for engine_id in (seeded.engine_id, ort_engine):
        claims = can_run(load_requirements(get_engine(seeded.app, engine_id)), worker.capabilities)
        assert (blocked_test_load(seeded.app, engine_id) is None) == claims
        answers.append(claims)
    assert answers == [False, True], "one engine each way, so the comparison can fail"


def test_a_build_cell_no_live_worker_can_build_says_what_its_job_will_wait_for(seeded: Seeded) -> None:
    """Builds stay submittable (a GPU worker may join, as a Pending pod waits for a node), but the
    matrix says the job will wait and for what, instead of a plain "new build"."""
    at = view("build").run()
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm89"]).run()
    assert frame(at, "target", "fp32").set_index("target").loc["TensorRT-RTX sm89", "fp32"] == "new build"
    with seeded.app.catalog.write() as session:
        for worker in session.exec(select(WorkerRecord)).all():
            worker.heartbeat_at = utcnow() - timedelta(days=30)  # far past any liveness window
            session.add(worker)
    at = view("build").run()
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm89"]).run()
    cell = frame(at, "target", "fp32").set_index("target").loc["TensorRT-RTX sm89", "fp32"]
    assert cell.startswith("new build, waits: no live worker can build it now: it needs a worker with TensorRT-RTX")
    assert not at.button(key="build_submit").disabled
