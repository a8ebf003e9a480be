"""`enginecache gc` against a real store and catalog (SQLite, and PostgreSQL where the catalog's
answers matter): unreferenced blobs and bundles go only with --apply, referenced ones stay; retired
engines' blobs go past the grace and stay within it; stale temp folders go, a live worker's stay;
abandoned PENDING rows become FAILED; a publish concurrent with gc never loses its blob; --json is
one document. And a one-shot `enginecache build` killed with SIGKILL takes its job's child with it.

Ages come from the injected clock and from file times set in the past: nothing sleeps."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from enginecache.core.hashing import hash_file
from enginecache.core.processes import pid_alive
from enginecache.core.store import BlobInfo
from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus
from enginecache.service.builds import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines import get_engine, retire_engine
from enginecache.service.gc import GcPolicy, GcReport, collect_garbage
from enginecache.service.models import register_model
from tests.clirunner import run_cli
from tests.conftest import FakeClock, skip_or_fail, wait_for
from tests.modelfactory import make_external_data_model, make_mlp

ROOT = Path(__file__).resolve().parents[1]
HOUR = 3600.0
DAY = 24 * HOUR
BOUND = 120.0  # seconds: generous; a wait that runs past it is a failure, not a slow pass


def _set_age(path: Path, seconds: float) -> None:
    """Make `path` (and what is below it) look `seconds` old to a clock at real time."""
    then = time.time() - seconds
    for item in [*(path.rglob("*") if path.is_dir() else ()), path]:
        os.utime(item, (then, then), follow_symlinks=False)


def _gc(app: AppContext, clock: FakeClock, *, apply: bool, **policy: timedelta) -> GcReport:
    return collect_garbage(app, apply=apply, policy=GcPolicy(**policy), clock=clock)


def _paths(report: GcReport, kind: str | None = None) -> set[str]:
    return {r.path for r in report.removals if kind is None or r.kind == kind}


def _cli(capsys: pytest.CaptureFixture[str], app: AppContext, *args: str) -> dict[str, Any]:
    """`enginecache gc ARGS --json` in this process (the real clock): its one document."""
    result = run_cli(capsys, "--home", str(app.home), "--db", app.db_url, "gc", *args, "--json")
    assert result.code == 0, result.err
    document: dict[str, Any] = json.loads(result.out)
    return document


def _ort_engine(app: AppContext, model: Path, name: str) -> EngineRecord:
    register_model(app, model, name=name)
    engine = build_engine(app, BuildRequest(model=name, backend="ort")).engine
    assert engine.status == EngineStatus.READY and engine.blob_path is not None
    return engine


def _dead_pid() -> int:
    """A pid no process can have: past the kernel's pid_max."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1


# -- unreferenced blobs and bundles -----------------------------------------------------------


def test_an_unreferenced_blob_goes_only_with_apply_and_a_referenced_one_stays(
    catalog_ctx: AppContext, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    app = catalog_ctx
    engine = _ort_engine(app, make_mlp(tmp_path / "mlp.onnx"), "mlp")
    ext = make_external_data_model(tmp_path / "ext")
    registered = register_model(app, ext, name="ext").model
    orphan = app.store.write_blob([b"no row names these bytes" * 100])
    unregistered = make_external_data_model(tmp_path / "other", seed=1)
    loose_bundle = app.store.put_model_bundle(unregistered, ["ext.onnx.data"], "f" * 64).parent
    for path in (orphan.path, app.home / (engine.blob_path or ""), app.home / "models", loose_bundle):
        _set_age(path, 2 * HOUR)  # old enough: only a reference keeps it

    dry = _cli(capsys, app)
    assert dry["applied"] is False
    assert {(r["kind"], r["path"], r["bytes"]) for r in dry["remove"]} == {
        ("unreferenced_blob", app.store.relative(orphan.path), orphan.size),
        ("unreferenced_bundle", "models/" + "f" * 64, sum(f.stat().st_size for f in loose_bundle.iterdir())),
    }
    assert dry["remove_bytes"] == sum(r["bytes"] for r in dry["remove"])
    assert orphan.path.is_file() and loose_bundle.is_dir()  # a dry run removes nothing

    applied = _cli(capsys, app, "--apply")
    assert applied["applied"] is True and applied["errors"] == []
    assert {r["path"] for r in applied["remove"]} == {r["path"] for r in dry["remove"]}
    assert not orphan.path.exists() and not loose_bundle.exists()
    assert (app.home / (engine.blob_path or "")).is_file()
    assert app.store.verify_blob(engine.sha256 or "").sha256 == engine.sha256
    bundle = app.home / registered.store_path
    assert bundle.is_file() and (bundle.parent / "ext.onnx.data").is_file()  # its external data too
    assert get_engine(app, engine.id or 0).status == EngineStatus.READY
    assert _cli(capsys, app, "--apply")["remove"] == []  # nothing left to do


def test_a_young_unreferenced_blob_stays_and_a_recent_jobs_input_blob_stays(app_ctx: AppContext) -> None:
    app, clock = app_ctx, FakeClock()
    young = app.store.write_blob([b"published a moment ago"])
    calibration = app.store.write_blob([b"a queued build's calibration data"])
    queue.enqueue(app.catalog, kind="build", payload={"calibration": str(calibration.path)}, requirements={})
    _set_age(calibration.path, 2 * HOUR)
    report = _gc(app, clock, apply=True)
    assert report.removals == []
    assert [(k.kind, k.path) for k in report.kept] == [("unreferenced_blob", app.store.relative(young.path))]
    assert young.path.is_file() and calibration.path.is_file()


# -- retired engines --------------------------------------------------------------------------


def test_a_retired_engines_blob_goes_past_the_grace_and_stays_within_it(app_ctx: AppContext, tmp_path: Path) -> None:
    app, clock = app_ctx, FakeClock()
    retired = _ort_engine(app, make_mlp(tmp_path / "a.onnx", seed=1), "a")
    ready = _ort_engine(app, make_mlp(tmp_path / "b.onnx", seed=2), "b")
    retire_engine(app, retired.id or 0, clock=clock)
    blob = app.home / (retired.blob_path or "")
    old_twin = _pending(  # a RETIRED row long past the grace, with the READY engine's very bytes
        app,
        ready.model_id,
        status=EngineStatus.RETIRED,
        sha256=ready.sha256,
        blob_path=ready.blob_path,
        created_at=clock.now - timedelta(days=90),
    )

    clock.advance(6 * DAY)  # within the default 7 days
    assert _gc(app, clock, apply=True).removals == []
    assert blob.is_file()
    assert _paths(_gc(app, clock, apply=False, grace=timedelta(days=5)), "retired_blob") == {retired.blob_path}

    clock.advance(2 * DAY)  # 8 days: past the grace
    report = _gc(app, clock, apply=True)
    assert [(r.kind, r.path, r.engine_ids) for r in report.removals] == [
        ("retired_blob", retired.blob_path, (retired.id,))
    ]
    assert not blob.exists()
    row = get_engine(app, retired.id or 0)
    assert row.status == EngineStatus.RETIRED and row.blob_path is None and row.sha256 == retired.sha256
    assert (app.home / (ready.blob_path or "")).is_file()  # READY: kept however old, whoever else names it
    assert get_engine(app, old_twin).blob_path == ready.blob_path


# -- temp folders -----------------------------------------------------------------------------


def test_stale_temp_folders_go_and_live_ones_stay(app_ctx: AppContext) -> None:
    app, clock = app_ctx, FakeClock()
    tmp = app.store.tmp_dir
    tmp.mkdir(parents=True, exist_ok=True)
    running = _job(app, JobStatus.RUNNING, 1)  # on a worker of another host, say
    dead, alive = _dead_pid(), os.getpid()
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
        _set_age(folders[name], 2 * HOUR)
    _set_age(partial, 2 * HOUR)

    report = _gc(app, clock, apply=True)
    assert _paths(report, "temp") == {
        app.store.relative(p) for p in (folders["stale"], folders["stale_staging"], partial)
    }
    assert {r.path: r.size_bytes for r in report.removals}[app.store.relative(folders["stale"])] == 1000
    assert not folders["stale"].exists() and not folders["stale_staging"].exists() and not partial.exists()
    kept = {k.path: k.reason for k in report.kept}
    assert f"pid {alive}) is alive" in kept[app.store.relative(folders["live_pid"])]
    assert "RUNNING attempt 1" in kept[app.store.relative(folders["running_elsewhere"])]
    assert app.store.relative(folders["young"]) in kept
    assert all(folders[n].is_dir() for n in ("live_pid", "running_elsewhere", "young"))


def test_pid_alive_tells_a_live_process_from_an_ended_one() -> None:
    assert pid_alive(os.getpid())
    assert not pid_alive(_dead_pid())
    assert not pid_alive(0) and not pid_alive(-1)
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    wait_for(lambda: not pid_alive(ended.pid), BOUND, "a child to exit")  # not reaped yet: a zombie
    os.kill(ended.pid, 0)  # the pid is still taken (by the zombie), and yet not alive
    ended.wait()


# -- abandoned PENDING engines ----------------------------------------------------------------


def _pending(app: AppContext, model_id: int, *, status: str = EngineStatus.PENDING, **fields: Any) -> int:
    """An engine row as a build leaves it (PENDING unless told otherwise); its id."""
    row = EngineRecord(
        model_id=model_id,
        backend="ort",
        backend_version="1",
        precision="fp32",
        targets="cpu",
        cache_key="k" * 64,
        onnx_digest="d" * 64,
        os="Linux",
        status=status,
        **fields,
    )
    with app.catalog.write() as session:
        session.add(row)
        session.flush()
        return row.id or 0


def _job(app: AppContext, status: JobStatus, attempts: int) -> int:
    with app.catalog.write() as session:
        job = JobRecord(kind="build", status=status, attempts=attempts)
        session.add(job)
        session.flush()
        return job.id or 0


def test_abandoned_pending_engines_are_marked_failed_with_the_reason(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app, clock = catalog_ctx, FakeClock()
    model_id = register_model(app, make_mlp(tmp_path / "m.onnx"), name="m").model.id or 0
    dead_job, live_job, queued_job = (
        _job(app, JobStatus.DEAD, 3),
        _job(app, JobStatus.RUNNING, 2),
        _job(app, JobStatus.QUEUED, 1),
    )
    abandoned = {
        _pending(app, model_id, job_id=dead_job, job_attempt=3): f"its job {dead_job} is DEAD",
        _pending(app, model_id, job_id=987654, job_attempt=1): "its job 987654 is gone",
        _pending(app, model_id, job_id=live_job, job_attempt=1): "running attempt 2",
        _pending(app, model_id, job_id=queued_job, job_attempt=1): "attempt 1 of job",
        _pending(app, model_id, created_at=clock.now - timedelta(hours=25)): "no job builds it",
    }
    live = {
        _pending(app, model_id, job_id=live_job, job_attempt=2),
        _pending(app, model_id, created_at=clock.now - timedelta(hours=1)),
    }
    tmp = app.store.tmp_dir
    tmp.mkdir(parents=True, exist_ok=True)
    abandoned_build, live_build = tmp / f"build-{min(abandoned)}-a", tmp / f"build-{min(live)}-b"
    for folder in (abandoned_build, live_build):
        folder.mkdir()
        _set_age(folder, 2 * HOUR)

    def statuses() -> dict[int, str]:
        with app.catalog.read() as session:
            return {r.id or 0: r.status for r in session.exec(select(EngineRecord)).all()}

    dry = _gc(app, clock, apply=False)
    assert {a.engine_id for a in dry.abandoned} == set(abandoned)
    assert set(statuses().values()) == {EngineStatus.PENDING}  # a dry run writes nothing

    report = _gc(app, clock, apply=True)
    assert {a.engine_id for a in report.abandoned} == set(abandoned)
    now = statuses()
    assert {i for i, s in now.items() if s == EngineStatus.FAILED} == set(abandoned)
    assert {i for i, s in now.items() if s == EngineStatus.PENDING} == live
    for engine_id, words in abandoned.items():
        row = get_engine(app, engine_id)
        assert row.error is not None and row.error.startswith("abandoned (found by gc)") and words in row.error
        assert row.finished_at == clock.now
    assert _paths(report, "temp") == {app.store.relative(abandoned_build)}  # its build folder is no one's now
    assert live_build.is_dir()
    assert _gc(app, clock, apply=True).abandoned == []  # marked once


# -- publishing concurrent with gc ------------------------------------------------------------


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


@pytest.mark.usefixtures("proc_locks")
def test_gc_waits_for_a_publish_under_way_and_keeps_what_it_published(app_ctx: AppContext) -> None:
    app, clock = app_ctx, FakeClock()
    data = b"bytes an old orphan and a new build share" * 50
    old = app.store.write_blob([data])
    _set_age(old.path, 2 * DAY)  # unreferenced and old: gc's to remove, unless it is published again
    with app.store.publish_lock():  # a publish under way (between its link and its return)
        gc_run = _Background(lambda: _gc(app, clock, apply=True))
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


# -- --json -----------------------------------------------------------------------------------


def test_gc_json_is_exactly_one_document_and_logs_go_to_stderr(
    app_ctx: AppContext, capsys: pytest.CaptureFixture[str]
) -> None:
    app = app_ctx
    orphan = app.store.write_blob([b"orphan"])
    _set_age(orphan.path, 2 * HOUR)
    dry = run_cli(capsys, "--home", str(app.home), "--db", app.db_url, "gc", "--json")
    assert dry.code == 0, dry.err
    assert json.loads(dry.out)["remove"][0]["path"] == app.store.relative(orphan.path)  # one document, nothing else
    applied = subprocess.run(  # a process of its own: the -v logging goes to its stderr, not to pytest's
        [
            sys.executable,
            "-m",
            "enginecache.cli",
            "-v",
            "--home",
            str(app.home),
            "--db",
            app.db_url,
            "gc",
            "--apply",
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=BOUND,
        check=False,
    )
    assert applied.returncode == 0, applied.stderr
    document, end = json.JSONDecoder().raw_decode(applied.stdout)
    assert applied.stdout[end:].strip() == ""  # exactly one document
    assert document["applied"] is True and document["remove"][0]["path"] == app.store.relative(orphan.path)
    assert "gc removed 1 entries" in applied.stderr
    assert not orphan.path.exists()
    text = run_cli(capsys, "--home", str(app.home), "--db", app.db_url, "gc")
    assert text.code == 0 and "would remove 0 entries" in text.out


# -- a killed one-shot build -------------------------------------------------------------------


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


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


def test_the_grace_counts_from_the_retirement_not_from_the_build(app_ctx: AppContext, tmp_path: Path) -> None:
    """An engine built a month ago and retired today keeps its blob for the grace period after today."""
    app, clock = app_ctx, FakeClock()
    old = _ort_engine(app, make_mlp(tmp_path / "old.onnx", seed=3), "old")
    with app.catalog.write() as session:
        row = session.get(EngineRecord, old.id)
        assert row is not None
        row.created_at = row.finished_at = clock.now - timedelta(days=30)
        session.add(row)
    retire_engine(app, old.id or 0, clock=clock)
    assert get_engine(app, old.id or 0).retired_at == clock.now
    clock.advance(6 * DAY)
    assert _gc(app, clock, apply=True).removals == [], "retired 6 days ago: within the grace"
    clock.advance(2 * DAY)
    assert _paths(_gc(app, clock, apply=True), "retired_blob") == {old.blob_path}
