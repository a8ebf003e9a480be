"""Use case: delete an engine (admin): retired now, and its blob removed now rather than after gc's
grace period (`enginecache engine delete ID`).

The row stays, RETIRED with `blob_path` cleared, as `gc` leaves an engine whose blob it removed: its
build and load timings, test-load runs and audit trail still name it, and no lookup returns it. The
blob is removed only where nothing else needs it: an engine row that is not RETIRED with the same
sha256 (identical bytes are stored once), or an active job whose payload names it; then it is kept and
the result says which. The removal happens under the store's gc lock, as gc's do, so a build
publishing the same bytes meanwhile waits and then writes them again. A PENDING engine (a build is
running) is refused: cancel its job first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from enginecache.core.blobpaths import blob_path
from enginecache.db.models import ACTIVE_JOB_STATUSES, EngineRecord, EngineStatus, JobRecord, utcnow
from enginecache.errors import BadInputError, StoreError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine, retire_engine
from enginecache.service.jobs.payloadblobs import payload_digests
from enginecache.service.maintenance.gc.references import clear_retired_blob_paths

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeleteResult:
    engine_id: int
    was: str  # the status before
    blob_removed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.engine_id,
            "was": self.was,
            "status": EngineStatus.RETIRED.value,
            "blob_removed": self.blob_removed,
            "reason": self.reason,
        }


def delete_engine(app: AppContext, engine_id: int, *, clock: Callable[[], datetime] = utcnow) -> DeleteResult:
    """Retire the engine and remove its blob now where nothing else needs it (module docstring).
    Raises NotFoundError for an unknown id, BadInputError for a PENDING engine, AccessDeniedError
    for anyone but an admin, StoreError where the blob cannot be removed (the engine stays RETIRED)."""
    access.require(app, "delete")
    engine = get_engine(app, engine_id)
    if engine.status == EngineStatus.PENDING:
        raise BadInputError(f"engine {engine_id} is PENDING (its build is running): cancel its job first")
    was = str(engine.status)
    retire_engine(app, engine_id, clock=clock)
    removed, reason = False, "it had no blob"
    if engine.sha256:
        with app.store.gc_lock():
            needs = _other_needs(app, engine_id, engine.sha256)
            if needs:
                reason = f"its blob is kept: {needs} still need it"
            else:
                _remove_blob(app, engine_id, engine.sha256)
                removed, reason = True, f"blob {engine.sha256} removed"
        if removed:
            clear_retired_blob_paths(app, col(EngineRecord.sha256) == engine.sha256)  # every row naming it
    logger.info("engine %s deleted: %s", engine_id, reason)
    details = {"was": was, "sha256": engine.sha256, "blob_removed": removed, "reason": reason}
    audit.record(app, audit.ENGINE_DELETE, f"engine {engine_id}", details)
    return DeleteResult(engine_id, was, removed, reason)


def _other_needs(app: AppContext, engine_id: int, sha256: str) -> str:
    """Who else needs the blob, in words ("" for nobody): engines not RETIRED, active jobs."""
    engines = sa.select(col(EngineRecord.id)).where(
        col(EngineRecord.sha256) == sha256,
        col(EngineRecord.id) != engine_id,
        col(EngineRecord.status) != EngineStatus.RETIRED,
    )
    jobs = sa.select(col(JobRecord.id), col(JobRecord.payload)).where(col(JobRecord.status).in_(ACTIVE_JOB_STATUSES))
    with app.catalog.read() as session:
        engine_ids = sorted(session.execute(engines).scalars())
        job_ids = sorted(job_id for job_id, payload in session.execute(jobs) if sha256 in set(payload_digests(payload)))
    parts = [f"engine {i}" for i in engine_ids] + [f"active job {i}" for i in job_ids]
    return ", ".join(parts)


def _remove_blob(app: AppContext, engine_id: int, sha256: str) -> None:
    path = blob_path(app.home, sha256)
    try:
        path.unlink(missing_ok=True)  # gone already (gc, an earlier delete): the outcome holds
    except OSError as err:
        raise StoreError(f"engine {engine_id} is RETIRED but its blob {path} could not be removed: {err}") from err
