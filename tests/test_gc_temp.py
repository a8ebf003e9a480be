"""`enginecache gc` on the store's temp folders: stale ones go, a live worker's (its pid alive
here, or its attempt RUNNING elsewhere) and young ones stay; and how a live process is told from an
ended one.

Ages come from the injected clock and from file times set in the past: nothing sleeps."""

from __future__ import annotations

import os
import subprocess
import sys

from enginecache.core.processes import pid_alive
from enginecache.db.models import JobStatus
from enginecache.service.context import AppContext
from enginecache.service.jobs.staging import staging_dir
from tests.conftest import FakeClock, wait_for
from tests.gckit import BOUND, HOUR, add_job_row, dead_pid, removed_paths, run_gc, set_age


def test_stale_temp_folders_go_and_live_ones_stay(app_ctx: AppContext) -> None:
    app, clock = app_ctx, FakeClock()
    tmp = app.store.tmp_dir
    tmp.mkdir(parents=True, exist_ok=True)
    running = add_job_row(app, JobStatus.RUNNING, 1)  # on a worker of another host, say
    dead, alive = dead_pid(), os.getpid()
    folders = {
        "stale": tmp / f"job-901-1-{dead}",
        "live_pid": tmp / f"job-902-1-{alive}",
        "running_elsewhere": tmp / f"job-{running}-1-{dead}",
        "young": tmp / f"job-903-1-{dead}",
        "stale_staging": tmp / "model-abc123",
    }
    for path in folders.values():
        (path / "build-9-x").mkdir(parents=True)
        (path / "build-9-x" / "engine.plan").write_bytes(b"e" * 1000)
    partial = tmp / "blob-xyz.partial"
    partial.write_bytes(b"p" * 10)
    for name in ("stale", "live_pid", "running_elsewhere", "stale_staging"):
        set_age(folders[name], 2 * HOUR)
    set_age(partial, 2 * HOUR)

    report = run_gc(app, clock, apply=True)
    assert removed_paths(report, "temp") == {
        app.store.relative(p) for p in (folders["stale"], folders["stale_staging"], partial)
    }
    assert {r.path: r.size_bytes for r in report.removals}[app.store.relative(folders["stale"])] == 1000
    assert not folders["stale"].exists() and not folders["stale_staging"].exists() and not partial.exists()
    kept = {k.path: k.reason for k in report.kept}
    assert f"pid {alive}) is alive" in kept[app.store.relative(folders["live_pid"])]
    assert "RUNNING attempt 1" in kept[app.store.relative(folders["running_elsewhere"])]
    assert app.store.relative(folders["young"]) in kept
    assert all(folders[n].is_dir() for n in ("live_pid", "running_elsewhere", "young"))


def test_a_jobs_staging_folder_stays_while_the_job_may_retry_and_goes_once_it_has_ended(app_ctx: AppContext) -> None:
    """A build job's staged engine (service.jobs.staging) left by a worker that died: kept while the
    job is QUEUED (a retry in its backoff) or RUNNING, however old; removed once the job is terminal or
    gone and nothing in it changed for the temp age."""
    app, clock = app_ctx, FakeClock()
    tmp = app.store.tmp_dir
    jobs = {
        "queued": add_job_row(app, JobStatus.QUEUED, 1),
        "running": add_job_row(app, JobStatus.RUNNING, 2),
        "dead": add_job_row(app, JobStatus.DEAD, 3),
        "succeeded": add_job_row(app, JobStatus.SUCCEEDED, 2),
        "young_failed": add_job_row(app, JobStatus.FAILED, 1),
    }
    folders = {name: staging_dir(tmp, job_id) for name, job_id in jobs.items()}
    folders["gone"] = staging_dir(tmp, 999_999)
    for name, path in folders.items():
        path.mkdir(parents=True)
        (path / "engine.plan").write_bytes(b"e" * 100)
        (path / "engine.json").write_text("{}")
        if name != "young_failed":
            set_age(path, 2 * HOUR)

    report = run_gc(app, clock, apply=True)
    gone = ("dead", "succeeded", "gone")
    assert removed_paths(report, "temp") == {app.store.relative(folders[n]) for n in gone}
    assert not any(folders[n].exists() for n in gone)
    kept = {k.path: k.reason for k in report.kept}
    for name in ("queued", "running"):
        assert f"job {jobs[name]} is QUEUED or RUNNING" in kept[app.store.relative(folders[name])]
        assert folders[name].is_dir()
    assert "changed" in kept[app.store.relative(folders["young_failed"])]


def test_pid_alive_tells_a_live_process_from_an_ended_one() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid())
    assert not pid_alive(0) and not pid_alive(-1)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not pid_alive(ended.pid), BOUND, "a child to exit")  # not reaped yet: a zombie
    os.kill(ended.pid, 0)  # the pid is still taken (by the zombie), and yet not alive
    ended.wait()
