"""What the catalog needs of the store, read at one time for `enginecache gc`: the blobs a row or a
job names (an engine's sha256 or blob_path; the payload of an active job or of one finished within
the grace; each file of an engine bundle), the blobs only RETIRED engines past the grace name, the
model bundles model rows name, the TensorRT-RTX runtime caches `runtime_caches` rows name (each kept
as long as its row), the PENDING engines (whose build folders may be in use), the attempts
RUNNING and the jobs QUEUED or RUNNING (whose staging folders a next attempt may use); and, once a
blob is removed, the one write that leaves its RETIRED rows without a path to nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import col

from enginecache.core.enginebundle import bundle_blobs
from enginecache.db.models import (
    ACTIVE_JOB_STATUSES,
    EngineRecord,
    EngineStatus,
    JobRecord,
    JobStatus,
    ModelRecord,
    RuntimeCacheRecord,
)
from enginecache.service.context import AppContext
from enginecache.service.jobs.payloadblobs import digest_of, payload_digests
from enginecache.service.maintenance.gc.report import GcPolicy


@dataclass(frozen=True)
class References:
    """What the catalog needs of the store, read at one time."""

    blobs: frozenset[str]  # digests a row or a job needs
    retired: dict[str, tuple[int, ...]]  # digest -> its RETIRED engines past the grace (no other row needs it)
    bundles: frozenset[str]  # folder names under models/
    pending: frozenset[int]  # PENDING engine ids (their build folders may be in use)
    running: frozenset[tuple[int, int]]  # (job id, attempt) of each RUNNING job
    active: frozenset[int] = frozenset()  # ids of the QUEUED and RUNNING jobs (their staging folders in use)


def read_references(app: AppContext, now: datetime, policy: GcPolicy) -> References:
    needed: set[str] = set()
    retired: dict[str, list[int]] = {}
    pending: set[int] = set()
    running: set[tuple[int, int]] = set()
    active: set[int] = set()
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
        col(EngineRecord.provenance),
    )
    recent = now - policy.grace
    jobs = sa.select(col(JobRecord.id), col(JobRecord.status), col(JobRecord.attempts), col(JobRecord.payload)).where(
        col(JobRecord.status).in_(ACTIVE_JOB_STATUSES) | (col(JobRecord.finished_at) >= recent)
    )
    models = sa.select(col(ModelRecord.digest), col(ModelRecord.store_path))
    with app.catalog.read() as session:
        for engine_id, status, sha256, blob_path, *times, retired_at, provenance in session.execute(engines):
            if status == EngineStatus.PENDING:
                pending.add(engine_id)
            digests = {d for d in (sha256, digest_of(blob_path)) if d is not None} | bundle_blobs(provenance)
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
            if status in ACTIVE_JOB_STATUSES:
                active.add(job_id)
            needed.update(payload_digests(payload))
        needed.update(session.execute(sa.select(col(RuntimeCacheRecord.sha256))).scalars())
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
        active=frozenset(active),
    )


def clear_retired_blob_paths(app: AppContext, which: ColumnElement[bool]) -> None:
    """The RETIRED rows `which` selects, whose blob was removed (by gc or `engine delete`), keep their
    sha256 but no blob_path: not a path to nothing."""
    with app.catalog.write() as session:
        session.execute(
            sa.update(EngineRecord)
            .where(which, col(EngineRecord.status) == EngineStatus.RETIRED)
            .values(blob_path=None)
        )
