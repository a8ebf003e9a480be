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
  `build-<engine>-*` unless that engine is still PENDING, a job's staging folder `job-<id>.staged`
  (service.jobs.staging: a built engine kept for the job's next attempt) unless that job is QUEUED
  or RUNNING, other staging folders and partial blobs;
- resume states `tmp/<sha256>.pull` (core.rangedfetch: what a killed fetch or pull left to resume)
  that no fetch holds and in which nothing changed for the resume age (default 1 day);
- what a killed backup or restore left (service.maintenance.gc.debris): a backup's partial folder
  beside its destination, found by its claim in `tmp/`, and a restore's folder beside the home,
  once no backup or restore holds it and nothing in it changed for the grace period;
Nothing in `objects/` or `models/` younger than the temp age is removed either: a blob or bundle is
published a moment before the row that names it is written (core.store: publishing touches it).

Marked FAILED, with the reason in `error`: PENDING engine rows whose job is terminal or gone, whose
job has moved past the attempt that made them (queued again, or another attempt running), or that
have no job and are older than the pending age (default 24 hours).

With `apply`, reading the references and removing blobs and bundles happen under the store's gc
lock (`ArtifactStore.gc_lock`, exclusive), which every publish takes shared: gc never removes a blob
or bundle that is being published. The catalog is written outside that lock (a publisher may hold
a catalog transaction while it waits for the lock). The clock is the caller's (`clock=`).

The parts: service.maintenance.gc.report (the policy and the report), service.maintenance.gc.references (what
the catalog
needs of the store), service.maintenance.gc.abandoned (the PENDING rows no build will finish),
service.maintenance.gc.plan
(what to remove from `objects/`, `models/` and `tmp/`) and service.maintenance.gc.files (the store's files, and
removing them).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sqlmodel import col

from enginecache.db.catalogfile import sqlite_file
from enginecache.db.models import EngineRecord, utcnow
from enginecache.db.queue import Clock
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.maintenance.gc.abandoned import find_abandoned_engines, mark_abandoned_engines
from enginecache.service.maintenance.gc.debris import plan_debris, remove_debris
from enginecache.service.maintenance.gc.files import remove
from enginecache.service.maintenance.gc.plan import plan_store, plan_temp
from enginecache.service.maintenance.gc.references import clear_retired_blob_paths, read_references
from enginecache.service.maintenance.gc.report import RETIRED_BLOB, GcPolicy, GcReport, Removal

__all__ = ["GcPolicy", "GcReport", "collect_garbage"]

logger = logging.getLogger(__name__)


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
            planned = plan_store(app, refs, now, policy, report)
            report.removals.extend(remove(app.home, r) for r in planned)
        _clear_retired_blob_paths(app, report.removals)
    else:
        refs = read_references(app, now, policy)
        report.removals.extend(plan_store(app, refs, now, policy, report))
    dead = {a.engine_id for a in report.abandoned}
    planned_temp = plan_temp(app, refs, dead, now, policy, report)
    report.removals.extend((remove(app.home, r) for r in planned_temp) if apply else planned_temp)
    tmp_dir, catalog = store.tmp_dir, sqlite_file(app.db_url)
    debris = plan_debris(app.home, tmp_dir, Path(catalog).resolve() if catalog else None, now, policy, report)
    report.removals.extend((remove_debris(app.home, tmp_dir, r) for r in debris) if apply else debris)
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


def _clear_retired_blob_paths(app: AppContext, removals: list[Removal]) -> None:
    """A RETIRED engine whose blob gc removed keeps its row (and sha256), not a path to nothing."""
    ids = sorted({i for r in removals if r.kind == RETIRED_BLOB and r.error is None for i in r.engine_ids})
    if ids:
        clear_retired_blob_paths(app, col(EngineRecord.id).in_(ids))
