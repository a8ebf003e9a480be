"""Who a worker's changes are recorded as (issue 28, point 6): a job records its submitter
(`jobs.submitted_by`, migration 0022), and the child that runs it acts as them, from the worker
(`audit.job_actor`), so a converted variant the dashboard's worker registers names the person who
pressed Build, and an import its test-load proves the person who pressed Test-load, not the
worker's OS user with a `cli ... pid` origin."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import onnxruntime as ort

from enginecache.core.fingerprint import host_fingerprint
from enginecache.db import engines, queue
from enginecache.service.access import audit
from enginecache.service.access.audit import acting_as, job_actor, list_audit, local_actor
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.builds.testload import submit_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.importing import ImportRequest, import_engine
from enginecache.service.jobs.worker import Worker, WorkerConfig
from enginecache.service.models.register import register_model
from tests.auditkit import ALICE, grant_role
from tests.test_engine_import import ort_engine


def test_a_variant_the_worker_registers_is_recorded_as_the_builds_submitter(catalog_ctx: AppContext, mlp: Path) -> None:
    app = catalog_ctx
    grant_role(app, ALICE.name, "operator")
    register_model(app, mlp, name="mlp")
    with acting_as(ALICE):
        submitted = submit_build(app, BuildRequest(model="mlp", backend="ort", precision="fp16"))
    assert submitted.job is not None
    job_id = submitted.job.id or 0
    assert queue.get_job(app.catalog, job_id).submitted_by == ALICE.name
    Worker(app, WorkerConfig(name="w", once=True)).run()  # acts as this test's OS user otherwise
    job = queue.get_job(app.catalog, job_id)
    assert job.status == "SUCCEEDED", job.error
    [variant] = [e for e in list_audit(app, action=audit.MODEL_REGISTER) if e.details.get("parent_id")]
    assert variant.actor == ALICE.name, variant
    assert variant.origin.startswith(f"worker {socket.gethostname()} pid ") and variant.origin.endswith(
        f" job {job_id}"
    ), variant.origin
    [submit] = list_audit(app, action=audit.BUILD_SUBMIT)
    assert submit.actor == ALICE.name and submit.origin == ALICE.origin


def test_an_import_a_worker_test_load_proves_is_recorded_as_the_test_loads_submitter(
    app_ctx: AppContext, mlp: Path, tmp_path: Path
) -> None:
    app = app_ctx
    grant_role(app, ALICE.name, "operator")
    register_model(app, mlp, name="mlp")
    declared = ImportRequest(
        path=ort_engine(mlp, tmp_path / "mlp.ort"),
        model="mlp",
        backend="ort",
        precision="fp32",
        targets=(host_fingerprint().cpu_target,),
        backend_version=ort.__version__,
    )
    engine_id = import_engine(app, declared).engine_id  # UNPROVEN, imported by this test's OS user
    with acting_as(ALICE):
        job = submit_test_load(app, engine_id, iterations=1)
    Worker(app, WorkerConfig(name="w", once=True)).run()
    assert queue.get_job(app.catalog, job.id or 0).status == "SUCCEEDED"
    [proven] = list_audit(app, action=engines.ENGINE_PROVEN)
    assert (proven.actor, proven.target) == (ALICE.name, f"engine {engine_id}")
    assert proven.origin.endswith(f" job {job.id}") and proven.origin.startswith("worker "), proven.origin
    [imported] = list_audit(app, action=engines.ENGINE_IMPORT)
    assert imported.actor == local_actor().name and imported.origin.startswith("cli "), "the import is not the job's"


def test_a_job_that_names_nobody_is_run_as_the_workers_os_user_from_the_worker() -> None:
    actor = job_actor(None, 7)
    assert actor.name == local_actor().name and actor.local
    assert actor.origin == f"worker {socket.gethostname()} pid {os.getpid()} job 7"
    assert job_actor("alice@example.com", 7).name == "alice@example.com"
