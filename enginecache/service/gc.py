"""Garbage collection of the store (`enginecache gc`): what no catalog row needs any more, and engine
rows left PENDING by builds that are gone.

Removed (a dry run lists them; `apply=True` removes them):
- unreferenced blobs: `objects/sha256/<2>/<digest>` that no engine row (its sha256 or blob_path)
  names, nor the payload of an active job or of one finished within the grace period (a build's
  calibration file, a test-load's inputs: they are blobs too);
- retired blobs: blobs that only RETIRED engines name, each of them retired (`retired_at`) more than
  the grace period ago (default 7 days; an engine retired before migration 0012 counts from its
  latest recorded time). The rows stay, their blob_path cleared. There is no "pinned" state: an
  engine in any other status keeps its blob;
- unreferenced model bundles: `models/<digest>` folders that no model row names;
- temp entries under `tmp/` older than the temp age (default 1 hour: a live build may be using
  them; age is the newest mtime within): job folders `job-<id>-<attempt>-<pid>` unless that worker
  pid is alive here or the job is RUNNING that attempt (a worker elsewhere), build folders
  `build-<engine>-*` unless that engine is still PENDING, staging folders and partial blobs.
Nothing in `objects/` or `models/` younger than the temp age is removed either: a blob or bundle is
published a moment before the row that names it is written (core.store: publishing touches it).

Marked FAILED, with the reason in `error`: PENDING engine rows whose job is terminal or gone, whose
job has moved past the attempt that made them (queued again, or another attempt running), or that
have no job and are older than the pending age (default 24 hours).

With `apply`, reading the references and removing blobs and bundles happen under the store's gc
lock (`ArtifactStore.gc_lock`, exclusive), which every publish takes shared: gc never removes a blob
or bundle that is being published. The catalog is written outside that lock (a publisher may hold
a catalog transaction while it waits for the lock). The clock is the caller's (`clock=`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from enginecache.core.processes import pid_alive
from enginecache.db.models import (
    ACTIVE_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    EngineRecord,
    EngineStatus,
    JobRecord,
    JobStatus,
    ModelRecord,
    utcnow,
)
from enginecache.db.queue import Clock
from enginecache.service import access, audit
from enginecache.service.context import AppContext

logger = logging.getLogger(__name__)

DEFAULT_GRACE = timedelta(days=7)
DEFAULT_TEMP_AGE = timedelta(hours=1)
DEFAULT_PENDING_AGE = timedelta(hours=24)

UNREFERENCED_BLOB = "unreferenced_blob"
RETIRED_BLOB = "retired_blob"
UNREFERENCED_BUNDLE = "unreferenced_bundle"
TEMP = "temp"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_JOB_DIR = re.compile(r"job-(\d+)-(\d+)-(\d+)")  # service.jobsupervisor: job-{id}-{attempt}-{worker pid}
_BUILD_DIR = re.compile(r"build-(\d+)-")  # service.builds: the store's temp_dir(prefix=f"build-{engine_id}-")


@dataclass(frozen=True)
class GcPolicy:
    grace: timedelta = DEFAULT_GRACE  # retired engines' blobs, and finished jobs' inputs
    temp_age: timedelta = DEFAULT_TEMP_AGE  # temp entries, and unreferenced blobs and bundles
    pending_age: timedelta = DEFAULT_PENDING_AGE  # PENDING engine rows with no job


@dataclass(frozen=True)
class Removal:
    """A file or folder gc removes (or, in a dry run, would remove); `error` when removing it failed."""

    kind: str
    path: str  # relative to the store's home
    size_bytes: int
    reason: str
    engine_ids: tuple[int, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "path": self.path, "bytes": self.size_bytes, "reason": self.reason}
        if self.engine_ids:
            data["engine_ids"] = list(self.engine_ids)
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass(frozen=True)
class Kept:
    """Something that would be removed but for a live owner or its youth."""

    kind: str
    path: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class AbandonedEngine:
    """A PENDING engine row no build will ever finish."""

    engine_id: int
    job_id: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.engine_id, "job_id": self.job_id, "reason": self.reason}


@dataclass
class GcReport:
    applied: bool
    policy: GcPolicy
    removals: list[Removal] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    abandoned: list[AbandonedEngine] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.removals)

    @property
    def size_bytes(self) -> int:
        return sum(r.size_bytes for r in self.removals if r.error is None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "grace_days": self.policy.grace / timedelta(days=1),
            "remove": [r.to_dict() for r in self.removals],
            "remove_bytes": self.size_bytes,
            "fail_pending": [a.to_dict() for a in self.abandoned],
            "kept": [k.to_dict() for k in self.kept],
            "errors": [f"{r.path}: {r.error}" for r in self.removals if r.error is not None],
        }


def collect_garbage(
    app: AppContext, *, apply: bool = False, policy: GcPolicy | None = None, clock: Clock = utcnow
) -> GcReport:
    """List (dry run) or remove what the catalog no longer needs; see the module docstring. Removing
    (`apply`) needs the admin role; a dry run only reads."""
    if apply:
        access.require(app, "gc")
    policy = policy or GcPolicy()
    now = clock()
    report = GcReport(applied=apply, policy=policy)
    abandoned = find_abandoned_engines(app, now, policy)
    report.abandoned = mark_abandoned_engines(app, abandoned, now) if apply else abandoned
    store = app.store
    if apply:
        with store.gc_lock():
            refs = read_references(app, now, policy)
            planned = _plan_store(app, refs, now, policy, report)
            report.removals.extend(_remove(app.home, r) for r in planned)
        _clear_retired_blob_paths(app, report.removals)
    else:
        refs = read_references(app, now, policy)
        report.removals.extend(_plan_store(app, refs, now, policy, report))
    dead = {a.engine_id for a in report.abandoned}
    planned_temp = _plan_temp(app, refs, dead, now, policy, report)
    report.removals.extend((_remove(app.home, r) for r in planned_temp) if apply else planned_temp)
    if apply:
        removed = sum(1 for r in report.removals if r.error is None)
        logger.info("gc removed %d entries, %d bytes", removed, report.size_bytes)
        failed = sum(1 for r in report.removals if r.error is not None)
        audit.record(
            app,
            audit.GC_APPLY,
            str(app.home),
            {
                "removed": removed,
                "bytes": report.size_bytes,
                "failed": failed,
                "abandoned_engines": [a.engine_id for a in report.abandoned],
            },
        )
    return report


# -- the catalog ------------------------------------------------------------------------------


@dataclass(frozen=True)
class References:
    """What the catalog needs of the store, read at one time."""

    blobs: frozenset[str]  # digests a row or a job needs
    retired: dict[str, tuple[int, ...]]  # digest -> its RETIRED engines past the grace (no other row needs it)
    bundles: frozenset[str]  # folder names under models/
    pending: frozenset[int]  # PENDING engine ids (their build folders may be in use)
    running: frozenset[tuple[int, int]]  # (job id, attempt) of each RUNNING job


def read_references(app: AppContext, now: datetime, policy: GcPolicy) -> References:
    needed: set[str] = set()
    retired: dict[str, list[int]] = {}
    pending: set[int] = set()
    running: set[tuple[int, int]] = set()
    bundles: set[str] = set()
    engines = sa.select(
        col(EngineRecord.id),
        col(EngineRecord.status),
        col(EngineRecord.sha256),
        col(EngineRecord.blob_path),
        col(EngineRecord.created_at),
        col(EngineRecord.finished_at),
        col(EngineRecord.verified_at),
        col(EngineRecord.retired_at),
    )
    recent = now - policy.grace
    jobs = sa.select(col(JobRecord.id), col(JobRecord.status), col(JobRecord.attempts), col(JobRecord.payload)).where(
        col(JobRecord.status).in_(ACTIVE_JOB_STATUSES) | (col(JobRecord.finished_at) >= recent)
    )
    models = sa.select(col(ModelRecord.digest), col(ModelRecord.store_path))
    with app.catalog.read() as session:
        for engine_id, status, sha256, blob_path, *times, retired_at in session.execute(engines):
            if status == EngineStatus.PENDING:
                pending.add(engine_id)
            digests = {d for d in (sha256, _digest_of(blob_path)) if d is not None}
            # since it was retired; a row retired before migration 0012: its latest recorded time
            since = retired_at or max(t for t in times if t is not None)
            if status == EngineStatus.RETIRED and since < recent:
                for digest in digests:
                    retired.setdefault(digest, []).append(engine_id)
            else:
                needed.update(digests)
        for job_id, status, attempts, payload in session.execute(jobs):
            if status == JobStatus.RUNNING:
                running.add((job_id, attempts))
            needed.update(_digests_in(payload))
        for digest, store_path in session.execute(models):
            bundles.add(digest)
            parts = Path(store_path).parts
            if len(parts) >= 2 and parts[0] == app.store.models_dir.name:
                bundles.add(parts[1])
    return References(
        blobs=frozenset(needed),
        retired={d: tuple(sorted(ids)) for d, ids in retired.items() if d not in needed},
        bundles=frozenset(bundles),
        pending=frozenset(pending),
        running=frozenset(running),
    )


def _digest_of(path: str | None) -> str | None:
    name = Path(path).name if path else ""
    return name if _HEX64.fullmatch(name) else None


def _digests_in(value: Any) -> Iterator[str]:
    """Every blob digest a job payload names: a string that is a digest or a path ending in one."""
    if isinstance(value, str):
        digest = _digest_of(value)
        if digest is not None:
            yield digest
    elif isinstance(value, dict):
        for item in value.values():
            yield from _digests_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _digests_in(item)


def find_abandoned_engines(app: AppContext, now: datetime, policy: GcPolicy) -> list[AbandonedEngine]:
    """PENDING engine rows that no build will finish (see the module docstring)."""
    query = (
        sa.select(
            col(EngineRecord.id),
            col(EngineRecord.job_id),
            col(EngineRecord.job_attempt),
            col(EngineRecord.created_at),
            col(JobRecord.id),
            col(JobRecord.status),
            col(JobRecord.attempts),
        )
        .select_from(EngineRecord)
        .outerjoin(JobRecord, col(JobRecord.id) == col(EngineRecord.job_id))
        .where(col(EngineRecord.status) == EngineStatus.PENDING)
        .order_by(col(EngineRecord.id))
    )
    found = []
    with app.catalog.read() as session:
        for engine_id, job_id, attempt, created_at, job_found, job_status, job_attempts in session.execute(query):
            reason = _abandoned_because(
                job_id, attempt, now - created_at, job_found is not None, job_status, job_attempts, policy
            )
            if reason is not None:
                found.append(AbandonedEngine(engine_id, job_id, reason))
    return found


def _abandoned_because(
    job_id: int | None,
    attempt: int | None,
    age: timedelta,
    job_found: bool,
    job_status: str | None,
    job_attempts: int | None,
    policy: GcPolicy,
) -> str | None:
    if job_id is None:
        if age < policy.pending_age:
            return None  # a build in a process of its own (build_engine) may still be running
        return f"no job builds it and it has been PENDING for {describe_age(age)}"
    if not job_found:
        return f"its job {job_id} is gone"
    if job_status in TERMINAL_JOB_STATUSES:
        return f"its job {job_id} is {job_status}"
    if job_status == JobStatus.RUNNING:
        if attempt is None or attempt == job_attempts:
            return None  # that attempt is running
        return f"job {job_id} is running attempt {job_attempts}; this row is attempt {attempt}'s"
    return f"attempt {attempt} of job {job_id} has ended (the job is {job_status})"


def mark_abandoned_engines(app: AppContext, engines: list[AbandonedEngine], now: datetime) -> list[AbandonedEngine]:
    """Mark each still-PENDING row FAILED (a conditional update: a row a build finished meanwhile
    keeps its status); the ones marked."""
    marked: list[AbandonedEngine] = []
    if not engines:
        return marked
    with app.catalog.write() as session:
        for engine in engines:
            result = session.execute(
                sa.update(EngineRecord)
                .where(col(EngineRecord.id) == engine.engine_id, col(EngineRecord.status) == EngineStatus.PENDING)
                .values(status=EngineStatus.FAILED, error=f"abandoned (found by gc): {engine.reason}", finished_at=now)
            )
            if _rowcount(result) == 1:
                marked.append(engine)
    for engine in marked:
        logger.info("engine %s: PENDING -> FAILED, %s", engine.engine_id, engine.reason)
    return marked


def _rowcount(result: Any) -> int:
    return int(result.rowcount)


def _clear_retired_blob_paths(app: AppContext, removals: list[Removal]) -> None:
    """A RETIRED engine whose blob gc removed keeps its row (and sha256), not a path to nothing."""
    ids = sorted({i for r in removals if r.kind == RETIRED_BLOB and r.error is None for i in r.engine_ids})
    if not ids:
        return
    with app.catalog.write() as session:
        session.execute(
            sa.update(EngineRecord)
            .where(col(EngineRecord.id).in_(ids), col(EngineRecord.status) == EngineStatus.RETIRED)
            .values(blob_path=None)
        )


# -- the store --------------------------------------------------------------------------------


def _plan_store(app: AppContext, refs: References, now: datetime, policy: GcPolicy, report: GcReport) -> list[Removal]:
    """The blobs and model bundles to remove (the young among them go to `report.kept`)."""
    store = app.store
    planned: list[Removal] = []
    for path in _blob_files(store.objects_dir):
        digest = path.name
        if digest in refs.blobs:
            continue
        info = path.lstat()
        age = _age(now, info.st_mtime)
        kind = RETIRED_BLOB if digest in refs.retired else UNREFERENCED_BLOB
        relative = store.relative(path)
        if age < policy.temp_age:
            report.kept.append(Kept(kind, relative, f"published {describe_age(age)} ago; its row may be on the way"))
        elif kind == RETIRED_BLOB:
            ids = refs.retired[digest]
            engines = ", ".join(str(i) for i in ids)
            reason = f"only RETIRED engines ({engines}) name it, none recorded within {describe_age(policy.grace)}"
            planned.append(Removal(kind, relative, info.st_size, reason, ids))
        else:
            reason = f"no engine or job names it ({describe_age(age)} old)"
            planned.append(Removal(kind, relative, info.st_size, reason))
    for path in _entries(store.models_dir):
        if path.name in refs.bundles or not path.is_dir() or path.is_symlink():
            continue
        age = _age(now, path.lstat().st_mtime)
        relative = store.relative(path)
        if age < policy.temp_age:
            report.kept.append(Kept(UNREFERENCED_BUNDLE, relative, f"stored {describe_age(age)} ago"))
        else:
            reason = f"no model names it ({describe_age(age)} old)"
            planned.append(Removal(UNREFERENCED_BUNDLE, relative, _tree_size(path), reason))
    return planned


def _plan_temp(
    app: AppContext, refs: References, dead: set[int], now: datetime, policy: GcPolicy, report: GcReport
) -> list[Removal]:
    """Temp entries to remove: old and with no live owner (see the module docstring)."""
    store = app.store
    planned: list[Removal] = []
    for path in _entries(store.tmp_dir):
        relative = store.relative(path)
        owner = _live_owner(path.name, refs, dead)
        age = _age(now, _newest_mtime(path))
        if owner is not None:
            report.kept.append(Kept(TEMP, relative, owner))
        elif age < policy.temp_age:
            report.kept.append(Kept(TEMP, relative, f"changed {describe_age(age)} ago"))
        else:
            planned.append(Removal(TEMP, relative, _tree_size(path), f"unchanged for {describe_age(age)}"))
    return planned


def _live_owner(name: str, refs: References, dead: set[int]) -> str | None:
    """Why a temp entry may be in use, or None."""
    job = _JOB_DIR.fullmatch(name)
    if job is not None:
        job_id, attempt, pid = (int(g) for g in job.groups())
        if pid_alive(pid):
            return f"its worker (pid {pid}) is alive"
        if (job_id, attempt) in refs.running:
            return f"job {job_id} is RUNNING attempt {attempt} (on a worker elsewhere)"
        return None
    build = _BUILD_DIR.match(name)
    if build is not None:
        engine_id = int(build.group(1))
        if engine_id in refs.pending and engine_id not in dead:
            return f"engine {engine_id} is PENDING (its build may be running)"
    return None


def _blob_files(objects_dir: Path) -> Iterator[Path]:
    """The blobs under objects/sha256/<2>/ (names the store writes; anything else is left alone)."""
    for shard in _entries(objects_dir):
        if len(shard.name) != 2 or not shard.is_dir() or shard.is_symlink():
            continue
        for path in _entries(shard):
            if _HEX64.fullmatch(path.name) and path.name[:2] == shard.name and not path.is_dir():
                yield path


def _entries(folder: Path) -> list[Path]:
    try:
        return sorted(Path(entry.path) for entry in os.scandir(folder))
    except FileNotFoundError:
        return []


def _walk(path: Path) -> Iterable[os.stat_result]:
    """lstat of `path` and of everything below it (symlinks not followed); gone entries skipped."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    yield info
    if stat.S_ISDIR(info.st_mode):
        for child in _entries(path):
            yield from _walk(child)


def _newest_mtime(path: Path) -> float:
    return max((info.st_mtime for info in _walk(path)), default=0.0)


def _tree_size(path: Path) -> int:
    return sum(info.st_size for info in _walk(path) if not stat.S_ISDIR(info.st_mode))


def _age(now: datetime, mtime: float) -> timedelta:
    return timedelta(seconds=now.timestamp() - mtime)


def _remove(home: Path, removal: Removal) -> Removal:
    path = home / removal.path
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, onerror=_unless_gone)
        else:
            path.unlink(missing_ok=True)  # gone meanwhile (another gc, a finishing build): the outcome holds
    except OSError as err:
        logger.warning("gc could not remove %s: %s", path, err)
        return Removal(removal.kind, removal.path, removal.size_bytes, removal.reason, removal.engine_ids, str(err))
    return removal


def _unless_gone(_function: Any, _path: str, exc_info: Any) -> None:
    """rmtree's error handler: an entry removed meanwhile is no error; anything else is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def describe_age(age: timedelta) -> str:
    seconds = age.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
