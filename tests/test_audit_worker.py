"""Who a worker's changes are recorded as (issue 28, point 6): a job records its submitter
(`jobs.submitted_by`, migration 0022), and the child that runs it acts as them, from the worker
(`audit.job_actor`), so a converted variant the dashboard's worker registers names the person who
pressed Build, not the worker's OS user with a `cli ... pid` origin."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from enginecache.db import queue
from enginecache.service.access import audit
from enginecache.service.access.audit import acting_as, job_actor, list_audit, local_actor
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.jobs.worker import Worker, WorkerConfig
from enginecache.service.models.register import register_model
from tests.auditkit import ALICE, grant_role


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


def test_a_job_that_names_nobody_is_run_as_the_workers_os_user_from_the_worker() -> None:
    actor = job_actor(None, 7)
    assert actor.name == local_actor().name and actor.local
    assert actor.origin == f"worker {socket.gethostname()} pid {os.getpid()} job 7"
    assert job_actor("alice@example.com", 7).name == "alice@example.com"
