"""Use cases for engines: list, show, verify blobs, check compatibility with this host or a worker's.

Compatibility is the backend's one rule (`Backend.compatibility`): `check_engine` adds the library's
header check here (`check_compatibility`); `host_verdict` decides the same rule from a worker's
fingerprint as the catalog recorded it, so the dashboard's per-host column and `check` agree.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.base import CompatibilityResult
from enginecache.core.backends.registry import get_backend
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord, utcnow
from enginecache.errors import IntegrityCheckError, NotFoundError
from enginecache.service.context import AppContext
from enginecache.service.enginerefs import engine_ref
from enginecache.service.listing import engine_dict
from enginecache.service.models import get_model
from enginecache.service.readmodels.hosts import worker_hosts

logger = logging.getLogger(__name__)


def get_engine(app: AppContext, engine_id: int) -> EngineRecord:
    with app.catalog.read() as session:
        found = session.get(EngineRecord, engine_id)
    if found is None:
        raise NotFoundError(f"no engine with id {engine_id} in the catalog")
    return found


def list_engines(app: AppContext, *, model: str | None = None, status: str | None = None) -> list[EngineRecord]:
    """Engines, newest first (the id breaking ties), as records; `model` and `status` filter. The CLI
    streams them a page at a time instead (`service.listing.stream_engines`)."""
    query = select(EngineRecord).order_by(col(EngineRecord.created_at).desc(), col(EngineRecord.id).desc())
    if model is not None:
        query = query.where(EngineRecord.model_id == get_model(app, model).id)
    if status is not None:
        query = query.where(EngineRecord.status == status.upper())
    with app.catalog.read() as session:
        return list(session.exec(query).all())


def model_names(app: AppContext) -> dict[int, str]:
    with app.catalog.read() as session:
        return {m.id or 0: m.name for m in session.exec(select(ModelRecord)).all()}


def engine_to_dict(
    app: AppContext,
    engine: EngineRecord,
    *,
    model_name: str | None = None,
    detail: bool = False,
    cache_hit: bool | None = None,
) -> dict[str, Any]:
    name = model_name if model_name is not None else model_names(app).get(engine.model_id)
    return engine_dict(app.home, engine, model_name=name, detail=detail, cache_hit=cache_hit)


@dataclass(frozen=True)
class VerifyResult:
    engine_id: int
    ok: bool
    status: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.engine_id, "ok": self.ok, "status": self.status, "message": self.message}


def verify_engines(app: AppContext, engine_ids: list[int] | None = None) -> list[VerifyResult]:
    """Re-hash each engine's blob in one pass; a mismatch or a missing blob marks it CORRUPT."""
    if engine_ids:
        engines = [get_engine(app, engine_id) for engine_id in engine_ids]
    else:
        engines = list_engines(app, status=EngineStatus.READY) + list_engines(app, status=EngineStatus.CORRUPT)
    results = []
    for engine in engines:
        if engine.sha256 is None:
            results.append(
                VerifyResult(engine.id or 0, False, engine.status, f"engine {engine.id} has no blob ({engine.status})")
            )
            continue
        try:
            app.store.verify_blob(engine.sha256)
        except IntegrityCheckError as err:
            _set_status(app, engine.id or 0, EngineStatus.CORRUPT)
            logger.warning("engine %s is corrupt: %s", engine.id, err)
            results.append(VerifyResult(engine.id or 0, False, EngineStatus.CORRUPT, str(err)))
            continue
        status = EngineStatus.READY if engine.status == EngineStatus.CORRUPT else engine.status
        _set_status(app, engine.id or 0, status, verified=True)
        results.append(VerifyResult(engine.id or 0, True, status, f"sha256 {engine.sha256} matches"))
    return results


def _set_status(app: AppContext, engine_id: int, status: str, *, verified: bool = False) -> None:
    with app.catalog.write() as session:
        row = session.get(EngineRecord, engine_id)
        if row is None:
            return
        row.status = status
        if verified:
            row.verified_at = utcnow()
        session.add(row)


def check_engine(app: AppContext, engine_id: int, *, host: HostFingerprint | None = None) -> CompatibilityResult:
    """Can this host load the engine? Verdict compatible | incompatible | unknown, with a reason."""
    engine = get_engine(app, engine_id)
    if engine.status != EngineStatus.READY or engine.blob_path is None:
        return CompatibilityResult("unknown", f"engine {engine_id} is {engine.status}, there is no engine to load")
    path = app.home / engine.blob_path
    if not path.is_file():
        return CompatibilityResult(
            "unknown", f"engine {engine_id}'s blob is missing from the store ({path}); run verify"
        )
    return get_backend(engine.backend).check_compatibility(engine_ref(engine, path), host or host_fingerprint())


def retire_engine(app: AppContext, engine_id: int) -> EngineRecord:
    """Mark an engine RETIRED: it stays in the catalog (and its blob in the store until gc), but
    no cache lookup returns it again, so the next request for its key builds anew."""
    with app.catalog.write() as session:
        row = session.get(EngineRecord, engine_id)
        if row is None:
            raise NotFoundError(f"no engine with id {engine_id} in the catalog")
        row.status = EngineStatus.RETIRED
        session.add(row)
    logger.info("engine %s retired", engine_id)
    return row


@dataclass(frozen=True)
class HostVerdict:
    host: str
    online: bool
    verdict: str  # compatible | incompatible | unknown
    reason: str


def engine_host_verdicts(app: AppContext, engine_id: int) -> list[HostVerdict]:
    """Could each known worker host load this engine? Decided from the catalog alone (the host's
    recorded GPUs, CPU target and library versions), so no GPU library is loaded here; the
    definitive header check runs on the host itself (`enginecache check`, or a test-load job)."""
    with app.catalog.read() as session:
        engine = session.get(EngineRecord, engine_id)
    if engine is None:
        raise NotFoundError(f"no engine with id {engine_id} in the catalog")
    verdicts: list[HostVerdict] = []
    seen: set[tuple[str, str]] = set()
    for host in worker_hosts(app):
        fingerprint = host.fingerprint
        identity = (host.hostname, str(sorted((fingerprint.get("packages") or {}).items())))
        if identity in seen:
            continue
        seen.add(identity)
        verdict, reason = host_verdict(engine, fingerprint)
        verdicts.append(HostVerdict(host.hostname, host.online, verdict, reason))
    return verdicts


def host_verdict(engine: EngineRecord, fingerprint: Mapping[str, Any]) -> tuple[str, str]:
    """(verdict, reason) of the backend's rule for a host as the catalog recorded its fingerprint."""
    if engine.status != EngineStatus.READY:
        return "unknown", f"engine {engine.id} is {engine.status}: there is nothing to load"
    result = get_backend(engine.backend).compatibility(engine_ref(engine), recorded_host(fingerprint))
    if result.compatible:
        return result.verdict, f"{result.reason} (header not checked from here)"
    return result.verdict, result.reason


# Fields a worker's recorded fingerprint may lack (one written by an older version): an empty OS is
# not compared, an empty CPU names no target, no packages means no library.
_HOST_DEFAULTS: dict[str, Any] = {
    "hostname": "",
    "os": "",
    "os_release": "",
    "machine": "",
    "python": "",
    "cpu_model": "",
}


def recorded_host(fingerprint: Mapping[str, Any]) -> HostFingerprint:
    """A worker's fingerprint from the catalog as the `HostFingerprint` the backends' rule takes."""
    gpus = [
        {"index": index, "name": "", "uuid": "", "compute_capability": "", "memory_total_bytes": 0, **gpu}
        for index, gpu in enumerate(fingerprint.get("gpus") or [])
    ]
    return HostFingerprint.from_dict({**_HOST_DEFAULTS, **fingerprint, "gpus": gpus})
