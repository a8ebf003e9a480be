"""`enginecache gc` and the store's lock: a publish concurrent with gc never loses its blob (gc
waits for a publish under way; a publish waits while gc holds the lock). And a one-shot
`enginecache build` killed with SIGKILL takes its job's child with it, the lock holding the child
at its publish.

Who waits for the lock is read from Linux's /proc/locks: nothing sleeps."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlmodel import select

from enginecache.core.hashing import hash_file
from enginecache.core.processes import pid_alive
from enginecache.core.store import BlobInfo
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord
from enginecache.service.context import AppContext
from enginecache.service.maintenance.gc.report import GcReport
from enginecache.service.models.register import register_model
from tests.conftest import FakeClock, skip_or_fail, wait_for
from tests.gckit import BOUND, DAY, ROOT, run_gc, set_age
from tests.modelfactory import make_mlp


def _lock_waiters(lock: Path, mode: str) -> list[int]:
    """The pids waiting for a `mode` (READ or WRITE) flock on `lock` (Linux's /proc/locks)."""
    inode = lock.stat().st_ino
    pids = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" not in fields:
            continue
        kind, _, wanted, pid, device_inode = fields[fields.index("->") + 1 :][:5]
        if kind == "FLOCK" and wanted == mode and int(device_inode.rsplit(":", 1)[1]) == inode:
            pids.append(int(pid))
    return pids


@pytest.fixture
def proc_locks() -> None:
    if not Path("/proc/locks").is_file():
        skip_or_fail("needs Linux's /proc/locks to see who waits for the store's lock")


class _Background:
    """`target()` run in a thread of its own; `result()` joins it (bounded) and returns or raises."""

    def __init__(self, target: Callable[[], object]) -> None:
        self._target = target
        self._out: dict[str, object] = {}
        self._thread = threading.Thread(target=self._run, name="gc-test", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._out["result"] = self._target()
        except BaseException as err:  # noqa: BLE001 - handed to the test, raised there
            self._out["error"] = err

    def result(self) -> object:
        self._thread.join(BOUND)
        assert not self._thread.is_alive(), "the thread did not finish"
        error = self._out.get("error")
        if isinstance(error, BaseException):
            raise error
        return self._out["result"]


# -- publishing concurrent with gc ------------------------------------------------------------


@pytest.mark.usefixtures("proc_locks")
def test_gc_waits_for_a_publish_under_way_and_keeps_what_it_published(app_ctx: AppContext) -> None:
    app, clock = app_ctx, FakeClock()
    data = b"bytes an old orphan and a new build share" * 50
    old = app.store.write_blob([data])
    set_age(old.path, 2 * DAY)  # unreferenced and old: gc's to remove, unless it is published again
    with app.store.publish_lock():  # a publish under way (between its link and its return)
        gc_run = _Background(lambda: run_gc(app, clock, apply=True))
        wait_for(lambda: bool(_lock_waiters(app.store.lock_path, "WRITE")), BOUND, "gc to wait for the lock")
        again = app.store.write_blob([data])  # the same bytes, published while gc waits
        assert not again.created
    report = gc_run.result()  # the publishes are done: gc runs now
    assert isinstance(report, GcReport)
    assert again.path.is_file() and hash_file(again.path).sha256 == again.sha256
    assert report.removals == [] and [k.path for k in report.kept] == [app.store.relative(again.path)]


@pytest.mark.usefixtures("proc_locks")
def test_a_publish_waits_while_gc_holds_its_lock_and_its_blob_survives(app_ctx: AppContext) -> None:
    app = app_ctx
    data = b"bytes gc is about to remove" * 50
    old = app.store.write_blob([data])
    with app.store.gc_lock():  # gc has decided to remove `old`
        publish = _Background(lambda: app.store.write_blob([data]))
        wait_for(lambda: bool(_lock_waiters(app.store.lock_path, "READ")), BOUND, "the publish to wait")
        old.path.unlink()  # gc removes it, still holding the lock
    info = publish.result()
    assert isinstance(info, BlobInfo)
    assert info.created and info.path.is_file() and hash_file(info.path).sha256 == old.sha256


# -- a killed one-shot build ------------------------------------------------------------------


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


@pytest.mark.slow
@pytest.mark.usefixtures("proc_locks")
def test_a_one_shot_build_killed_with_sigkill_takes_its_jobs_child_with_it(app_ctx: AppContext, tmp_path: Path) -> None:
    """`enginecache build` with no worker runs the job in a child of its zygote; SIGKILL to the
    command alone (no cleanup runs) must end that child, before it publishes anything. The store's
    lock, held here, stops the child at its publish, so it is surely mid-build when the command dies."""
    app = app_ctx
    register_model(app, make_mlp(tmp_path / "k.onnx"), name="k")
    command = [sys.executable, "-m", "enginecache.cli", "--home", str(app.home), "--db", app.db_url]
    child = zygote = 0
    with open(tmp_path / "build.log", "wb") as log, app.store.gc_lock():
        build = subprocess.Popen(
            [*command, "build", "k", "--backend", "ort", "--json"],
            cwd=ROOT,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        try:

            def publishing() -> bool:
                with app.catalog.read() as session:
                    job = session.exec(select(JobRecord)).first()
                pid = job.runner_pid if job is not None else None
                return bool(pid and pid in _lock_waiters(app.store.lock_path, "READ")) or build.poll() is not None

            wait_for(publishing, BOUND, "the build's child to reach its publish")
            assert build.poll() is None, (tmp_path / "build.log").read_text()
            with app.catalog.read() as session:
                job = session.exec(select(JobRecord)).one()
            child = job.runner_pid or 0
            zygote = _parent_of(child)
            assert zygote not in (build.pid, os.getpid())  # the zygote's child, as the one-shot worker runs it

            os.kill(build.pid, signal.SIGKILL)  # the command alone: its zygote and the child are not signalled
            build.wait(BOUND)
            wait_for(lambda: not pid_alive(child) and not pid_alive(zygote), BOUND, "the child and its zygote to end")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(build.pid, signal.SIGKILL)
            for pid in (child, zygote):
                if pid and pid_alive(pid):
                    os.kill(pid, signal.SIGKILL)
            build.wait(BOUND)
    # The lock is free now: a child still alive would publish and mark its engine READY.
    with app.catalog.read() as session:
        engines = session.exec(select(EngineRecord)).all()
    assert [e.status for e in engines] == [EngineStatus.PENDING]
    assert [p for p in app.store.objects_dir.rglob("*") if p.is_file()] == []  # nothing was published
