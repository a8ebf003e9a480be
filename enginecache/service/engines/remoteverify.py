"""`enginecache verify --remote`: each engine's copy in the remote store re-hashed where it is kept.

The object is read by ranged GETs and checked chunk by chunk where the row records chunk digests, by
its whole sha256 where not (core.remotecheck); an engine bundle's manifest object, then each of its
files' objects against the manifest. The catalog records when (`remote_verified_at`) and
what was found (`remote_problem`: None, or the reason naming the key and the chunk), audited
`engine.remote_bad` when found bad and `engine.remote_ok` when found whole again.

A bad remote copy does not change the engine's status: the status is its local blob's (`verify`
without `--remote` re-hashes that), every host that fetches the object verifies it as it lands and
refuses it, and the next publish of the blob (a build, `ingest`, or `push` of the same bytes) hashes
the existing object and replaces it, conditionally on its ETag (core.objectstore). `verify --remote`
then finds it whole and clears the problem.
"""

from __future__ import annotations

import logging

from enginecache.core.blobpaths import blob_relative
from enginecache.core.remotecheck import check_stored_blob
from enginecache.db import engines
from enginecache.db.models import EngineRecord, EngineStatus, utcnow
from enginecache.errors import BadInputError, IntegrityCheckError
from enginecache.service.access import audit
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import bundle_manifest_anywhere, is_bundle
from enginecache.service.engines.records import VerifyResult, get_engine, list_engines

logger = logging.getLogger(__name__)

_CHECKED = (EngineStatus.READY, EngineStatus.UNPROVEN)


def verify_remote(app: AppContext, engine_ids: list[int] | None = None) -> list[VerifyResult]:
    """Re-hash the remote copy of each named engine (default: every READY or UNPROVEN one) and record
    the outcome; a result is not ok where the object is missing or not the blob. BadInputError where no
    remote store is set; StoreError (nothing recorded for that engine) where it cannot be read."""
    remote = app.store.remote
    if remote is None:
        raise BadInputError("no remote store is set (ENGINECACHE_STORE=s3://bucket/prefix): there is no remote copy")
    if engine_ids:
        found = [get_engine(app, engine_id) for engine_id in engine_ids]
    else:
        found = [e for status in _CHECKED for e in list_engines(app, status=status)]
    results = []
    for engine in found:
        engine_id = engine.id or 0
        if engine.sha256 is None or engine.size_bytes is None:
            results.append(VerifyResult(engine_id, False, engine.status, f"engine {engine_id} has no blob"))
            continue
        name = f"{blob_relative(engine.sha256)} in {remote.describe()}"
        problem: str | None = None
        try:
            check_stored_blob(
                remote, name=name, sha256=engine.sha256, size=engine.size_bytes, chunk_blake3=engine.chunk_blake3
            )
            if is_bundle(engine):  # its manifest is whole: each file's object too
                for entry in bundle_manifest_anywhere(app, engine).files:
                    where = f"{entry.path} ({blob_relative(entry.sha256)} in {remote.describe()})"
                    check_stored_blob(
                        remote, name=where, sha256=entry.sha256, size=entry.size, chunk_blake3=entry.chunk_blake3
                    )
        except IntegrityCheckError as err:
            problem = str(err)
            logger.warning("engine %s's remote copy is bad: %s", engine_id, problem)
        _record(app, engine, problem)
        message = f"remote copy bad: {problem}" if problem else f"remote copy {name} matches sha256 {engine.sha256}"
        results.append(VerifyResult(engine_id, problem is None, engine.status, message))
    return results


def _record(app: AppContext, engine: EngineRecord, problem: str | None) -> None:
    with app.catalog.changes() as ex:
        engines.record_remote_check(
            ex, engine.id or 0, at=utcnow(), problem=problem, actor=audit.current_actor(), by="verify --remote"
        )
