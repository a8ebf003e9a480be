"""`jobs` and `job show` say what a QUEUED job waits for by the same answer as `build --queue`,
`test-load --queue` and the dashboard (`service.builds.whocan`): a live one-shot worker (another
command's, which claims only its own job) never counts as one that will run it."""

from __future__ import annotations

from enginecache.core.fingerprint import host_fingerprint
from enginecache.db import queue
from enginecache.service.builds.submit import waiting_reason
from enginecache.service.context import AppContext
from enginecache.service.jobs.routing import worker_capabilities
from enginecache.service.readmodels.listing import show_job, stream_jobs


def _worker(app: AppContext, name: str, scope: str) -> None:
    host = host_fingerprint(probe_gpus=False)
    capabilities = {**worker_capabilities(host), "scope": scope}
    queue.register_worker(
        app.catalog, name=name, hostname=host.hostname, pid=1, fingerprint=host.to_dict(), capabilities=capabilities
    )


def test_a_one_shot_worker_does_not_make_a_queued_job_look_taken(app_ctx: AppContext) -> None:
    job = queue.enqueue(app_ctx.catalog, kind="build", payload={}, requirements={"backend": "ort"}).job
    _worker(app_ctx, "oneshot-other", "job")
    expected = waiting_reason(app_ctx, job)
    assert expected is not None and expected.startswith("waiting for a worker with ONNX Runtime")
    assert show_job(app_ctx, job.id or 0)["waiting"] == expected
    with stream_jobs(app_ctx) as rows:
        assert [r["waiting"] for r in rows] == [expected]

    _worker(app_ctx, "queue-worker", "queue")
    assert waiting_reason(app_ctx, job) is None
    assert show_job(app_ctx, job.id or 0)["waiting"] is None
