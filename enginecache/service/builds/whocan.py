"""Whether a live worker can do a job now: the one answer the queue's waits, the CLI and the
dashboard's disabled buttons share.

A worker is live while its liveness lease holds (`service.readmodels.liveness`: status online and a
heartbeat within WORKER_ALIVE_SECONDS); it can run a job when `service.jobs.routing.can_run`, the
rule the worker itself claims by, accepts the job's requirements on its capabilities, and it takes
queued jobs generally (a CLI's one-shot worker claims only its own job, so it never counts). A
test-load's requirements are `routing.load_requirements` of its engine, the ones `submit_test_load`
gives its job, so "no live worker can load it" here is exactly a job that would wait QUEUED.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from enginecache.db import queue
from enginecache.db.models import WorkerRecord, utcnow
from enginecache.db.queue import Clock
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.jobs.routing import can_run, describe_requirements, load_requirements, takes_queued_jobs
from enginecache.service.readmodels.liveness import alive_since


def live_workers(app: AppContext, *, clock: Clock = utcnow) -> list[WorkerRecord]:
    """Workers whose liveness lease is unexpired: online, with a heartbeat in the last
    WORKER_ALIVE_SECONDS (a worker renews it while it runs; one that died stops renewing it)."""
    return queue.list_workers(app.catalog, alive_since=alive_since(clock()))


def workers_that_can(
    app: AppContext,
    requirements: Mapping[str, Any],
    *,
    clock: Clock = utcnow,
    live: Sequence[WorkerRecord] | None = None,
) -> list[WorkerRecord]:
    """Live workers that take queued jobs generally and would claim a job with these requirements.
    `live`: the `live_workers` already read (a view asking about many cells reads them once)."""
    return [
        w
        for w in (live_workers(app, clock=clock) if live is None else live)
        if takes_queued_jobs(w.capabilities) and can_run(requirements, w.capabilities)
    ]


def blocked_test_load(app: AppContext, engine_id: int, *, clock: Clock = utcnow) -> str | None:
    """Why no test-load of this engine would run now ('no live worker can load it: it needs a worker
    with TensorRT-RTX 1.7.1 and an SM86 GPU on Linux'), or None when a live worker would claim it."""
    needs = load_requirements(get_engine(app, engine_id))
    if workers_that_can(app, needs, clock=clock):
        return None
    return f"no live worker can load it: it needs {describe_requirements(needs)}"


def blocked_build(
    app: AppContext,
    requirements: Mapping[str, Any],
    *,
    clock: Clock = utcnow,
    live: Sequence[WorkerRecord] | None = None,
) -> str | None:
    """Why a build job with these requirements (`routing.build_requirements` of its plan, the ones
    `submit_build` gives it) would wait QUEUED now ('no live worker can build it now: it needs ...'),
    or None when a live worker would claim it. Submitting it is still allowed: it waits for such a
    worker, as a Pending pod waits for a node. `live` as for `workers_that_can`."""
    if workers_that_can(app, requirements, clock=clock, live=live):
        return None
    return f"no live worker can build it now: it needs {describe_requirements(requirements)}"
