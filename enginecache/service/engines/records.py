"""Use cases for engines: list, show, verify blobs, check compatibility with this host or a worker's.

Compatibility is the backend's one rule (`Backend.compatibility`): `check_engine` adds the library's
header check here (`check_compatibility`); `host_verdict` decides the same rule from a worker's
fingerprint as the catalog recorded it, so the dashboard's per-host column and `check` agree.

A blob is always the file its sha256 implies (`core.blobpaths`), never the row's `blob_path`; `verify`
and `check` re-hash it in full (sha256, and BLAKE3 where recorded) before anything judges its bytes, so
`check` never hands a library the header of a blob that does not match its digest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.base import CompatibilityResult, EngineRef
from enginecache.core.backends.registry import get_backend
from enginecache.core.blobpaths import blob_path
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.hashing import DigestResult, check_file
from enginecache.core.verdicts import Verdict
from enginecache.db import engines
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord, utcnow
from enginecache.errors import IntegrityCheckError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.engines import signatures
from enginecache.service.jobs.refs import engine_ref
from enginecache.service.readmodels import modelrefs
from enginecache.service.readmodels.hosts import worker_hosts
from enginecache.service.readmodels.listing import catalog_rows, engine_dict, model_version

logger = logging.getLogger(__name__)

# The statuses whose engine a host may be asked to load (UNPROVEN: an import, to prove it).
_LOADABLE = (EngineStatus.READY, EngineStatus.UNPROVEN)


def get_engine(app: AppContext, engine_id: int) -> EngineRecord:
    with app.catalog.read() as session:
        found = session.get(EngineRecord, engine_id)
    if found is None:
        raise NotFoundError(f"no engine with id {engine_id} in the catalog")
    return found


def list_engines(app: AppContext, *, model: str | None = None, status: str | None = None) -> list[EngineRecord]:
    """Engines, newest first (the id breaking ties), as records; `model` and `status` filter. The CLI
    streams them a page at a time instead (`service.readmodels.listing.stream_engines`), and `model`
    covers the same models: every version of a bare NAME, else the one model the reference names."""
    query = select(EngineRecord).order_by(col(EngineRecord.created_at).desc(), col(EngineRecord.id).desc())
    if model is not None:
        with catalog_rows(app) as source:
            scope = modelrefs.resolve(source, model).scope_ids
        query = query.where(col(EngineRecord.model_id).in_(scope))
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
    with catalog_rows(app) as source:
        version = model_version(source, engine.model_id)
    return engine_dict(app.home, engine, model_name=name, model_version=version, detail=detail, cache_hit=cache_hit)


@dataclass(frozen=True)
class VerifyResult:
    engine_id: int
    ok: bool
    status: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "engine", "id": self.engine_id, "ok": self.ok, "status": self.status, "message": self.message}


def verify_blob_at(path: Path, engine: EngineRecord) -> DigestResult:
    """Re-hash the blob at `path` in one pass against the engine's recorded sha256 (and BLAKE3 where
    recorded: what a load checks); its digests. Raises IntegrityCheckError on a mismatch; OSError
    where unreadable."""
    return check_file(path, sha256=engine.sha256, blake3_digest=engine.blake3)


def verify_engines(app: AppContext, engine_ids: list[int] | None = None, *, sign: bool = False) -> list[VerifyResult]:
    """Re-hash each engine's blob (at the path its sha256 implies) in one pass, and each file of an
    engine bundle against its manifest; a mismatch or a missing blob or file marks it CORRUPT. A row
    whose `blob_path` names another file is set to the digest's path, and
    one without the digest of its header (built before migration 0015), or with another, gets the
    header's, from the same pass: its loads check the header first from then on.

    Its signed statement (`service.engines.signatures`): where trusted keys are configured, a row
    that no longer says what was signed is marked TAMPERED before its blob is read, and an unsigned
    or untrusted one is not ok; without them the result says what is recorded. `sign` (an admin's
    `verify --sign`): each engine whose blob matched is signed with the pool's key where unsigned,
    or re-signed where a trusted key other than the pool's signed it."""
    checks, key = signatures.verify_setup(app, sign=sign)
    if engine_ids:
        found = [get_engine(app, engine_id) for engine_id in engine_ids]
    else:
        wanted = (*_LOADABLE, EngineStatus.CORRUPT, EngineStatus.TAMPERED)
        found = [e for status in wanted for e in list_engines(app, status=status)]
    results = []
    for engine in found:
        if engine.sha256 is None:
            results.append(
                VerifyResult(engine.id or 0, False, engine.status, f"engine {engine.id} has no blob ({engine.status})")
            )
            continue
        tampered = signatures.tampered_row(app, engine, checks)
        if tampered is not None:
            results.append(VerifyResult(engine.id or 0, False, EngineStatus.TAMPERED, tampered))
            continue
        try:
            path = blob_path(app.home, engine.sha256)
            if not path.is_file():
                raise IntegrityCheckError(f"blob {engine.sha256} is missing from {path.parent}")
            digest = verify_blob_at(path, engine)
            bundle_files = _verify_bundle_files(app, engine)
        except IntegrityCheckError as err:
            _mark_corrupt(app, engine.id or 0, "verify", err)
            results.append(VerifyResult(engine.id or 0, False, EngineStatus.CORRUPT, str(err)))
            continue
        message = f"sha256 {engine.sha256} matches"
        if bundle_files:
            message += f" (its manifest; each of its bundle's {bundle_files} files matches too)"
        relative = app.store.relative(path)
        if engine.blob_path != relative:
            message += f" (its blob_path {engine.blob_path!r} named another file: set to {relative!r})"
        if (engine.chunk_blake3 or "") != digest.chunk_blake3:
            message += " (chunk digests recorded)" if not engine.chunk_blake3 else " (chunk digests corrected)"
        if engine.header_blake3 != digest.head_blake3:
            message += (
                " (header digest recorded)"
                if engine.header_blake3 is None
                else f" (its header digest {engine.header_blake3} was not its header's: set to {digest.head_blake3})"
            )
        with app.catalog.changes() as ex:
            was = engines.mark_verified(
                ex,
                engine.id or 0,
                at=utcnow(),
                blob_path=relative,
                header_blake3=digest.head_blake3,
                chunk_blake3=digest.chunk_blake3 or None,
                actor=audit.current_actor(),
                by="verify",
                reason=message,
            )
            now = engines.engine_fields(ex, engine.id or 0, ("status",))  # READY, or UNPROVEN (an unproven import)
        status = str(now["status"]) if now is not None else (was or engine.status)
        signed = signatures.after_blob(app, engine.id or 0, checks, key)
        status = signed.status or status
        results.append(VerifyResult(engine.id or 0, signed.ok, status, f"{message}; {signed.message}"))
    return results


def _verify_bundle_files(app: AppContext, engine: EngineRecord) -> int:
    """For an engine bundle (its blob is the manifest), each file checked against the manifest: how
    many (IntegrityCheckError naming the first that does not match); 0 for one file."""
    if not (engine.provenance or {}).get("bundle"):
        return 0
    from enginecache.service.engines.bundles import verify_bundle  # it imports this module's neighbours

    return len(verify_bundle(app, engine).files)


def _mark_corrupt(app: AppContext, engine_id: int, by: str, err: IntegrityCheckError) -> None:
    logger.warning("engine %s is corrupt: %s", engine_id, err)
    with app.catalog.changes() as ex:
        engines.mark_corrupt(ex, engine_id, actor=audit.current_actor(), by=by, reason=str(err))


CORRUPT_VERDICT = Verdict.CORRUPT  # `check_engine`'s verdict for a blob that does not match its digest
# `check_engine`'s verdicts that refuse the engine (the CLI exits 1)
REFUSED_VERDICTS = (Verdict.CORRUPT, Verdict.TAMPERED, Verdict.UNTRUSTED)


def check_engine(app: AppContext, engine_id: int, *, host: HostFingerprint | None = None) -> CompatibilityResult:
    """Can this host load the engine? Verdict compatible | incompatible | unknown, with a reason; or
    `corrupt`: the blob (the file its sha256 implies, re-hashed in full first) does not match its
    recorded digest, the engine is marked CORRUPT and the backend is never handed its header; or,
    where trusted keys are configured, `tampered` (its row no longer says what was signed: marked
    TAMPERED) or `untrusted` (unsigned, or signed by a key not trusted here), decided before the blob
    is read. Without trusted keys the reason ends with what is recorded of its signature."""
    engine = get_engine(app, engine_id)
    if engine.status == EngineStatus.TAMPERED:
        return CompatibilityResult(
            Verdict.TAMPERED,
            f"engine {engine_id} is TAMPERED: its row no longer says what was signed (the audit log says when and "
            "why); `verify` puts it back once its row is restored",
        )
    if engine.status not in _LOADABLE or engine.sha256 is None:
        return CompatibilityResult(
            Verdict.UNKNOWN, f"engine {engine_id} is {engine.status}, there is no engine to load"
        )
    try:
        path = blob_path(app.home, engine.sha256)
        if not path.is_file():
            return CompatibilityResult(
                Verdict.UNKNOWN, f"engine {engine_id}'s blob is missing from the store ({path}); run verify"
            )
        refused = signatures.check_refusal(app, engine)
        if refused is not None:
            return CompatibilityResult(refused[0], refused[1], {"signature": engine.signature})
        verify_blob_at(path, engine)
    except IntegrityCheckError as err:
        _mark_corrupt(app, engine_id, "check", err)
        return CompatibilityResult(
            CORRUPT_VERDICT,
            f"engine {engine_id} is CORRUPT (now marked so; its header was not checked): {err}",
            {"sha256": engine.sha256, "blake3": engine.blake3},
        )
    result = get_backend(engine.backend).check_compatibility(engine_ref(engine, path), host or host_fingerprint())
    return replace(result, reason=f"{result.reason}; {signatures.check_note(engine)}")


def retire_engine(app: AppContext, engine_id: int, *, clock: Callable[[], datetime] = utcnow) -> EngineRecord:
    """Mark an engine RETIRED: it stays in the catalog (and its blob in the store until gc), but
    no cache lookup returns it again, so the next request for its key builds anew."""
    access.require(app, "retire")
    details = {"model_id": get_engine(app, engine_id).model_id}
    with app.catalog.changes() as ex:
        was = engines.retire(ex, engine_id, at=clock(), actor=audit.current_actor(), by="retire", details=details)
    if was is None:
        raise NotFoundError(f"no engine with id {engine_id} in the catalog")
    logger.info("engine %s retired", engine_id)
    return get_engine(app, engine_id)


@dataclass(frozen=True)
class HostVerdict:
    host: str
    online: bool
    verdict: Verdict  # COMPATIBLE | INCOMPATIBLE | UNKNOWN
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


def host_verdict(engine: EngineRecord, fingerprint: Mapping[str, Any]) -> tuple[Verdict, str]:
    """(verdict, reason) of the backend's rule for a host as the catalog recorded its fingerprint."""
    if engine.status not in _LOADABLE:
        return Verdict.UNKNOWN, f"engine {engine.id} is {engine.status}: there is nothing to load"
    return ref_verdict(engine_ref(engine), recorded_host(fingerprint))


def ref_verdict(ref: EngineRef, host: HostFingerprint) -> tuple[Verdict, str]:
    """`host_verdict` of a READY engine given as its `EngineRef`, for a host already made a
    fingerprint (`recorded_host`): what a view judging many engine groups per host calls, once per
    distinct ref and host (the rule reads nothing else)."""
    result = get_backend(ref.backend).compatibility(ref, host)
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
