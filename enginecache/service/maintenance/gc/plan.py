"""The plan of `enginecache gc` for the store, by the rules of service.maintenance.gc.collect's docstring, from what the
catalog needs (service.maintenance.gc.references): which blobs under `objects/` (unreferenced, or retired past the
grace), which model bundles under `models/` and which entries under `tmp/` to remove (a ranged fetch's
resume state by its own age, `GcPolicy.resume_age`). What would go
but for its youth (a blob or bundle is published a moment before the row that names it) or a live
owner (a job folder's worker alive here or its attempt RUNNING, a job's staging folder's job QUEUED or
RUNNING, a build folder's engine PENDING) is
listed as kept instead."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from enginecache.core import rangedfetch
from enginecache.core.processes import pid_alive
from enginecache.service.context import AppContext
from enginecache.service.jobs.staging import staging_job_id
from enginecache.service.maintenance import workdirs
from enginecache.service.maintenance.gc.files import age_of, blob_files, entries, newest_mtime, tree_size
from enginecache.service.maintenance.gc.references import References
from enginecache.service.maintenance.gc.report import (
    RESUME_STATE,
    RETIRED_BLOB,
    TEMP,
    UNREFERENCED_BLOB,
    UNREFERENCED_BUNDLE,
    GcPolicy,
    GcReport,
    Kept,
    Removal,
    describe_age,
)

_JOB_DIR = re.compile(r"job-(\d+)-(\d+)-(\d+)")  # service.jobs.supervisor: job-{id}-{attempt}-{worker pid}
_BUILD_DIR = re.compile(r"build-(\d+)-")  # service.builds.plan: the store's temp_dir(prefix=f"build-{engine_id}-")


def plan_store(app: AppContext, refs: References, now: datetime, policy: GcPolicy, report: GcReport) -> list[Removal]:
    """The blobs and model bundles to remove (the young among them go to `report.kept`)."""
    store = app.store
    planned: list[Removal] = []
    for path in blob_files(store.objects_dir):
        digest = path.name
        if digest in refs.blobs:
            continue
        info = path.lstat()
        age = age_of(now, info.st_mtime)
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
    for path in entries(store.models_dir):
        if path.name in refs.bundles or not path.is_dir() or path.is_symlink():
            continue
        age = age_of(now, path.lstat().st_mtime)
        relative = store.relative(path)
        if age < policy.temp_age:
            report.kept.append(Kept(UNREFERENCED_BUNDLE, relative, f"stored {describe_age(age)} ago"))
        else:
            reason = f"no model names it ({describe_age(age)} old)"
            planned.append(Removal(UNREFERENCED_BUNDLE, relative, tree_size(path), reason))
    return planned


def plan_temp(
    app: AppContext, refs: References, dead: set[int], now: datetime, policy: GcPolicy, report: GcReport
) -> list[Removal]:
    """Temp entries to remove: old and with no live owner (see the module docstring)."""
    store = app.store
    planned: list[Removal] = []
    for path in entries(store.tmp_dir):
        relative = store.relative(path)
        if rangedfetch.is_state_name(path.name):
            planned.extend(_plan_resume_state(path, relative, now, policy, report))
            continue
        if workdirs.is_claim_name(path.name):  # a backup's claim: service.maintenance.gc.debris
            continue
        owner = _live_owner(path.name, refs, dead)
        age = age_of(now, newest_mtime(path))
        if owner is not None:
            report.kept.append(Kept(TEMP, relative, owner))
        elif age < policy.temp_age:
            report.kept.append(Kept(TEMP, relative, f"changed {describe_age(age)} ago"))
        else:
            planned.append(Removal(TEMP, relative, tree_size(path), f"unchanged for {describe_age(age)}"))
    return planned


def _plan_resume_state(path: Path, relative: str, now: datetime, policy: GcPolicy, report: GcReport) -> list[Removal]:
    """A ranged fetch's resume state (core.rangedfetch): kept while a fetch holds it or one may still
    resume it (changed within the resume age), else removed."""
    age = age_of(now, newest_mtime(path))
    if rangedfetch.state_held(path):
        report.kept.append(Kept(RESUME_STATE, relative, "a fetch is at work on it"))
    elif age < policy.resume_age:
        report.kept.append(Kept(RESUME_STATE, relative, f"a fetch may resume it (changed {describe_age(age)} ago)"))
    else:
        reason = f"no fetch resumed it for {describe_age(age)}"
        return [Removal(RESUME_STATE, relative, tree_size(path), reason)]
    return []


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
    staged = staging_job_id(name)
    if staged is not None:
        if staged in refs.active:
            return f"job {staged} is QUEUED or RUNNING (its next attempt publishes what is staged here)"
        return None
    build = _BUILD_DIR.match(name)
    if build is not None:
        engine_id = int(build.group(1))
        if engine_id in refs.pending and engine_id not in dead:
            return f"engine {engine_id} is PENDING (its build may be running)"
    return None
