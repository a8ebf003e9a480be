"""The audit log (`service.access.audit`, table `audit_events`): every change recorded once, right after it
succeeded, with its actor, origin and target; the actor each block and thread records as; an
in-process build and a corrupt engine met by load_or_build audited."""

from __future__ import annotations

import getpass
import os
import socket
import threading
from pathlib import Path

import pytest

from enginecache.core.blobpaths import blob_path
from enginecache.db.models import EngineStatus, JobStatus, ModelStatus
from enginecache.service.access import audit
from enginecache.service.access.audit import Actor, acting_as, current_actor, list_audit, local_actor, record
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.submit import cancel_job, submit_build
from enginecache.service.builds.testload import run_test_load, submit_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.records import check_engine, get_engine, retire_engine, verify_engines
from enginecache.service.models.register import get_model, register_model
from enginecache.service.models.verify import bundle_path, verify_models
from tests.auditkit import ALICE, grant_role
from tests.conftest import corrupt_blob


def _events(app: AppContext) -> list[tuple[str, str]]:
    """(action, target) of every event, oldest first."""
    return [(e.action, e.target) for e in reversed(list_audit(app, limit=None))]


# -- what is recorded -------------------------------------------------------------------------


def test_every_change_is_recorded_once_with_its_actor_origin_and_target(catalog_ctx: AppContext, mlp: Path) -> None:
    app = catalog_ctx
    request = BuildRequest(model="mlp", backend="ort")
    grant_role(app, ALICE.name)
    with acting_as(ALICE):
        model = register_model(app, mlp, name="mlp").model
        register_model(app, mlp)  # the same bytes, nothing changed: not recorded
        submitted = submit_build(app, request)
        assert submitted.job is not None and not submitted.joined
        assert submit_build(app, request).joined  # joined the active job: not recorded
        cancel_job(app, submitted.job.id or 0)
        assert cancel_job(app, submitted.job.id or 0).status == JobStatus.CANCELLED  # already: not recorded
        engine = build_engine(app, request).engine
        assert submit_build(app, request).cache_hit  # a cache hit: not recorded
        test_load = submit_test_load(app, engine.id or 0, iterations=1)
        assert submit_test_load(app, engine.id or 0, iterations=1).id == test_load.id  # joined: not recorded

        blob = blob_path(app.home, engine.sha256)
        at = corrupt_blob(blob)
        verify_engines(app, [engine.id or 0])
        verify_engines(app, [engine.id or 0])  # still CORRUPT: no second record
        corrupt_blob(blob, at)  # the same bits flipped back: whole again
        verify_engines(app, [engine.id or 0])
        corrupt_blob(blob, at)
        assert check_engine(app, engine.id or 0).verdict == "corrupt"
        corrupt_blob(blob, at)
        verify_engines(app, [engine.id or 0])
        corrupt_blob(blob, at)
        assert run_test_load(app, engine.id or 0, iterations=1).verdict == "CORRUPT"
        corrupt_blob(blob, at)
        verify_engines(app, [engine.id or 0])
        retire_engine(app, engine.id or 0)
        retire_engine(app, engine.id or 0)  # already RETIRED: not recorded

        corrupt_blob(bundle_path(app, model))
        verify_models(app)
        verify_models(app)  # still CORRUPT: no second record
        assert register_model(app, mlp).repaired
        assert get_model(app, model.id or 0).status == ModelStatus.OK
    assert get_engine(app, engine.id or 0).status == EngineStatus.RETIRED

    m, e, j = f"model {model.id}", f"engine {engine.id}", f"job {submitted.job.id}"
    assert _events(app) == [
        (audit.MODEL_REGISTER, m),
        (audit.BUILD_SUBMIT, m),
        (audit.JOB_CANCEL, j),
        (audit.BUILD_RUN, e),  # build_engine built it in this process
        (audit.TEST_LOAD_SUBMIT, e),
        (audit.ENGINE_CORRUPT, e),
        (audit.ENGINE_READY, e),
        (audit.ENGINE_CORRUPT, e),
        (audit.ENGINE_READY, e),
        (audit.ENGINE_CORRUPT, e),
        (audit.ENGINE_READY, e),
        (audit.ENGINE_RETIRE, e),
        (audit.MODEL_CORRUPT, m),
        (audit.MODEL_REPAIR, m),
    ]
    events = list_audit(app, limit=None)
    assert {(ev.actor, ev.origin) for ev in events} == {(ALICE.name, ALICE.origin)}
    assert all(ev.at.tzinfo is not None for ev in events)
    by_action = {ev.action: ev.details for ev in reversed(events)}  # the newest of each action
    registered = by_action[audit.MODEL_REGISTER]
    assert registered["name"] == "mlp" and registered["digest"] == model.digest and registered["new_version"] is False
    assert by_action[audit.BUILD_SUBMIT]["job_id"] == submitted.job.id
    assert by_action[audit.BUILD_SUBMIT]["backend"] == "ort" and by_action[audit.BUILD_SUBMIT]["precision"] == "fp32"
    assert by_action[audit.JOB_CANCEL] == {"kind": "build", "was": "QUEUED", "status": "CANCELLED"}
    assert by_action[audit.TEST_LOAD_SUBMIT]["job_id"] == test_load.id
    corrupt_by = [ev.details["by"] for ev in reversed(events) if ev.action == audit.ENGINE_CORRUPT]
    assert corrupt_by == ["verify", "check", "test-load"]
    assert by_action[audit.ENGINE_RETIRE]["was"] == "READY"
    assert model.digest in by_action[audit.MODEL_CORRUPT]["reason"]

    assert [ev.action for ev in list_audit(app, action=audit.ENGINE_READY)] == [audit.ENGINE_READY] * 3
    newest_two = list_audit(app, limit=2)
    assert [ev.action for ev in newest_two] == [audit.MODEL_REPAIR, audit.MODEL_CORRUPT]
    assert [ev.id for ev in list_audit(app, limit=2, offset=1)] == [ev.id for ev in events[1:3]]
    assert audit.audit_actions(app) == sorted({a for a, _ in _events(app)})


def test_the_default_actor_is_the_local_os_user(catalog_ctx: AppContext) -> None:
    event = record(catalog_ctx, "test.default", "nothing")
    assert (event.actor, event.origin) == (getpass.getuser(), f"cli {socket.gethostname()} pid {os.getpid()}")
    assert current_actor() == local_actor()


def test_acting_as_changes_the_recorded_actor_for_its_block_and_thread(app_ctx: AppContext) -> None:
    bob = Actor("bob", "dashboard 10.0.0.8")
    seen: list[Actor] = []
    with acting_as(ALICE):
        record(app_ctx, "test.outer", "a")
        with acting_as(bob):
            record(app_ctx, "test.inner", "b")
        record(app_ctx, "test.outer_again", "c")
        other = threading.Thread(target=lambda: seen.append(current_actor()))  # a thread starts with nobody
        other.start()
        other.join()
    record(app_ctx, "test.after", "d")
    events = list(reversed(list_audit(app_ctx)))
    assert [(e.action, e.actor) for e in events] == [
        ("test.outer", ALICE.name),
        ("test.inner", "bob"),
        ("test.outer_again", ALICE.name),
        ("test.after", getpass.getuser()),
    ]
    assert events[1].origin == "dashboard 10.0.0.8"
    assert seen == [local_actor()]


def test_an_in_process_build_and_a_corrupt_engine_met_by_load_or_build_are_audited(
    catalog_ctx: AppContext, tmp_path: Path
) -> None:
    from enginecache.errors import EngineRejectedError
    from enginecache.service.serving.runtime import load_or_build
    from enginecache.service.serving.runtimetypes import RuntimeSpec
    from tests.conftest import corrupt_blob
    from tests.modelfactory import make_mlp

    app = catalog_ctx
    onnx_path = make_mlp(tmp_path / "served.onnx", seed=11)
    loaded = load_or_build(onnx_path, spec=RuntimeSpec(backend="ort"), app=app)  # a miss: built here
    engine_id = loaded.engine_id
    loaded.close()
    (built,) = list_audit(app, action=audit.BUILD_RUN)
    assert built.target == f"engine {engine_id}" and built.actor == local_actor().name
    assert built.details["backend"] == "ort"
    corrupt_blob(blob_path(app.home, get_engine(app, engine_id).sha256))
    with pytest.raises(EngineRejectedError, match="CORRUPT"):
        load_or_build(onnx_path, spec=RuntimeSpec(backend="ort"), app=app, on_miss="fail")
    (marked,) = list_audit(app, action=audit.ENGINE_CORRUPT)
    assert marked.target == f"engine {engine_id}"
    assert {k: marked.details[k] for k in ("by", "was")} == {"by": "load_or_build", "was": "READY"}
    assert marked.details["reason"], "the audit row says what did not match"
