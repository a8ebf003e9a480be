"""TensorRT-RTX runtime caches written back by the fleet: publish, list, choose, fetch.

A serving process that loaded a TensorRT-RTX engine compiled its kernels for its GPU; it can
publish the serialized runtime cache (`publish_runtime_cache`): the bytes become a blob in the store
(and its remote), and a `runtime_caches` row keys them by (engine, GPU SKU, compute capability,
TensorRT-RTX version, CUDA version), audited `runtime_cache.publish`. `pull` and `load_or_build`
on another host ask `best_for_host`, which lists the engine's caches and lets `core.runtimecache`
(the one owner of the reuse rule) pick; `fetch_runtime_cache` makes the chosen blob present here,
checked against its digests, and gives its path. A cache the rule refuses is never returned.

Producing a real cache needs an RTX GPU (`TensorRTEngineSession.runtime_cache_bytes`); this module
treats the bytes as opaque.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from enginecache.core.runtimecache import (
    CacheTarget,
    has_runtime_caches,
    host_target,
    normalize_sm,
    parse_version,
    select,
)
from enginecache.errors import BadInputError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access.roles import require
from enginecache.service.context import AppContext

__all__ = [
    "RUNTIME_CACHE_PUBLISH",
    "best_for_host",
    "fetch_runtime_cache",
    "has_runtime_caches",
    "host_target",
    "land_runtime_cache",
    "list_runtime_caches",
    "manifest_entry",
    "publish_runtime_cache",
    "publish_session_cache",
    "runtime_cache_dict",
    "runtime_cache_rows",
    "this_host_target",
]

RUNTIME_CACHE_PUBLISH = "runtime_cache.publish"
DASHBOARD_LIMIT = 500  # runtime caches the Hosts view lists at most

TYPE_CHECKING = False
if TYPE_CHECKING:
    from enginecache.db.models import EngineRecord, RuntimeCacheRecord


def this_host_target(engine_sha256: str) -> CacheTarget | None:
    """`host_target` of this host (`core.fingerprint.host_fingerprint`)."""
    from enginecache.core.fingerprint import host_fingerprint

    return host_target(engine_sha256, host_fingerprint())


def _rtx_engine(app: AppContext, engine_id: int) -> EngineRecord:
    from enginecache.db.models import EngineRecord

    with app.catalog.read() as session:
        engine = session.get(EngineRecord, engine_id)
    if engine is None:
        raise NotFoundError(f"no engine with id {engine_id}")
    if not has_runtime_caches(engine.backend):
        raise BadInputError(f"engine {engine_id} is a {engine.backend} engine; runtime caches are TensorRT-RTX's")
    if not engine.sha256:
        raise BadInputError(f"engine {engine_id} has no blob (status {engine.status})")
    return engine


def _checked_key(gpu_sku: str, compute_capability: str, rtx_version: str, cuda_version: str) -> tuple[str, ...]:
    sm = normalize_sm(compute_capability)
    problems = []
    if not gpu_sku.strip():
        problems.append("the GPU SKU is empty")
    if sm is None:
        problems.append(f"compute capability {compute_capability!r} is not like sm89 or 8.9")
    if parse_version(rtx_version) is None:
        problems.append(f"TensorRT-RTX version {rtx_version!r} is not dotted integers")
    if parse_version(cuda_version) is None:
        problems.append(f"CUDA version {cuda_version!r} is not dotted integers")
    if problems or sm is None:
        raise BadInputError("runtime cache key refused: " + "; ".join(problems))
    return " ".join(gpu_sku.split()), sm, rtx_version.strip(), cuda_version.strip()


def publish_runtime_cache(
    app: AppContext,
    engine_id: int,
    path: Path,
    *,
    gpu_sku: str | None = None,
    compute_capability: str | None = None,
    rtx_version: str | None = None,
    cuda_version: str | None = None,
) -> RuntimeCacheRecord:
    """Store the runtime-cache file `path` for engine `engine_id` under its key: each key field
    given, else this host's (`this_host_target`). A second publish of the same bytes under the same
    key returns the row already there (and audits nothing). BadInputError: not a TensorRT-RTX engine
    with a blob, an empty or unreadable file, a key field missing or malformed (nothing is stored);
    NotFoundError: no such engine; AccessDeniedError: the actor may not upload."""
    from sqlmodel import select as sql_select

    from enginecache.db.models import RuntimeCacheRecord

    require(app, "upload")
    engine = _rtx_engine(app, engine_id)
    assert engine.sha256 is not None
    if not path.is_file():
        raise BadInputError(f"runtime cache file {path} is not a file")
    if path.stat().st_size == 0:
        raise BadInputError(f"runtime cache file {path} is empty")
    here = None
    if None in (gpu_sku, compute_capability, rtx_version, cuda_version):
        here = this_host_target(engine.sha256)
        if here is None:
            raise BadInputError(
                "this host's GPU, TensorRT-RTX or CUDA version is unknown: give the runtime cache's key "
                "(GPU SKU, compute capability, TensorRT-RTX and CUDA versions)"
            )
    key = _checked_key(
        gpu_sku if gpu_sku is not None else here.gpu_sku if here else "",
        compute_capability if compute_capability is not None else here.compute_capability if here else "",
        rtx_version if rtx_version is not None else here.rtx_version if here else "",
        cuda_version if cuda_version is not None else here.cuda_version if here else "",
    )
    blob = app.store.ingest_file(path)
    actor = audit.current_actor()
    fields: dict[str, Any] = dict(
        engine_id=engine_id,
        gpu_sku=key[0],
        compute_capability=key[1],
        rtx_version=key[2],
        cuda_version=key[3],
        sha256=blob.sha256,
    )
    with app.catalog.write() as session:
        existing = session.exec(sql_select(RuntimeCacheRecord).filter_by(**fields)).first()
        if existing is not None:
            return existing
        row = RuntimeCacheRecord(
            **fields,
            engine_sha256=engine.sha256,
            blake3=blob.blake3,
            chunk_blake3=blob.chunk_blake3,
            size_bytes=blob.size,
            actor=actor.name,
            host=socket.gethostname(),
        )
        session.add(row)
        session.flush()
        session.refresh(row)
        session.expunge(row)
    audit.record(app, RUNTIME_CACHE_PUBLISH, f"engine {engine_id}", runtime_cache_dict(row))
    return row


def publish_session_cache(
    app: AppContext, engine_id: int, session: Any, **key: str | None
) -> RuntimeCacheRecord | None:
    """What a serving process calls after its first inferences: the runtime cache of `session` (a
    loaded TensorRT-RTX engine's `runtime_cache_bytes()`, which needs an RTX GPU) published for
    `engine_id` by `publish_runtime_cache` (`key` its key fields, this host's by default), through a
    temporary file in the store's tmp/ that is removed afterwards. None where the session has no
    runtime cache (another backend) or it is empty."""
    read = getattr(session, "runtime_cache_bytes", None)
    data = read() if callable(read) else None
    if not data:
        return None
    with app.store.temp_dir("runtime-cache-") as work:
        path = work / "runtime-cache.bin"
        path.write_bytes(data)
        return publish_runtime_cache(app, engine_id, path, **key)


def list_runtime_caches(
    app: AppContext, engine_id: int | None = None, *, limit: int | None = None
) -> list[RuntimeCacheRecord]:
    """Runtime caches, newest first (the id breaking ties), of `engine_id` where given, at most `limit`."""
    from sqlmodel import col
    from sqlmodel import select as sql_select

    from enginecache.db.models import RuntimeCacheRecord

    query = sql_select(RuntimeCacheRecord).order_by(
        col(RuntimeCacheRecord.created_at).desc(), col(RuntimeCacheRecord.id).desc()
    )
    if engine_id is not None:
        query = query.where(RuntimeCacheRecord.engine_id == engine_id)
    with app.catalog.read() as session:
        return list(session.exec(query.limit(limit)).all())


def runtime_cache_rows(
    app: AppContext, limit: int = DASHBOARD_LIMIT, *, engine_id: int | None = None
) -> list[dict[str, Any]]:
    """What the dashboard lists (the Hosts view every engine's, the engine page `engine_id`'s): the
    newest `limit` runtime caches as plain values, by engine and GPU (engine id, then GPU SKU, then
    newest first)."""
    rows = [runtime_cache_dict(c) for c in list_runtime_caches(app, engine_id, limit=limit)]
    return sorted(rows, key=lambda r: (-int(r["engine_id"]), str(r["gpu_sku"]), -int(r["id"] or 0)))


def best_for_host(app: AppContext, engine_id: int, host: CacheTarget | None) -> RuntimeCacheRecord | None:
    """The engine's cache `core.runtimecache.select` picks for `host` (None: nothing fits, or the
    host's facts are unknown)."""
    if host is None:
        return None
    return select(list_runtime_caches(app, engine_id), host)


def fetch_runtime_cache(app: AppContext, cache: RuntimeCacheRecord) -> Path:
    """The store's path of `cache`'s blob, fetched from the remote where it is not here, checked
    against its recorded sha256 and BLAKE3. IntegrityCheckError: the bytes are not the blob."""
    from enginecache.core.hashing import check_file

    fetched = app.store.fetch(cache.sha256, size=cache.size_bytes, chunk_blake3=cache.chunk_blake3 or None)
    check_file(fetched.path, sha256=cache.sha256, blake3_digest=cache.blake3)
    return fetched.path


def land_runtime_cache(app: AppContext, cache: RuntimeCacheRecord, dest: Path) -> int:
    """Copy `cache`'s blob into the pulled folder `dest` (`dest/objects/sha256/..`, read-only), from the
    catalog's store folder where this host has it, else from the object store; verified against its
    sha256 as it lands (a copy already there is kept when it hashes right). The bytes copied.
    IntegrityCheckError: the source is not the blob; StoreError: it cannot be read."""
    from enginecache.core.blobpaths import blob_path, blob_relative
    from enginecache.core.hashing import hash_file
    from enginecache.core.resumable import copy_resumable
    from enginecache.core.store import ArtifactStore
    from enginecache.core.storeenv import configured as remote_configured

    landed = dest / blob_relative(cache.sha256)
    if landed.is_file():
        if hash_file(landed).sha256 == cache.sha256:
            return 0
        landed.unlink()
    source = blob_path(app.home, cache.sha256)
    if not source.is_file() and remote_configured():
        fetched = ArtifactStore(dest).fetch(
            cache.sha256, size=cache.size_bytes, chunk_blake3=cache.chunk_blake3 or None, mode=0o444
        )
        return fetched.fetched_bytes
    return copy_resumable(source, landed, dest / "tmp" / f"{cache.sha256}.partial", sha256=cache.sha256)


def manifest_entry(cache: RuntimeCacheRecord) -> dict[str, Any]:
    """What a pull manifest says of the runtime cache it pulled: its key, digests and blob path."""
    from enginecache.core.blobpaths import blob_relative

    return {**runtime_cache_dict(cache), "blob": blob_relative(cache.sha256)}


def runtime_cache_dict(cache: RuntimeCacheRecord) -> dict[str, Any]:
    """A runtime cache as plain values (the CLI's --json, the audit row, a pull manifest's entry)."""
    return {
        "id": cache.id,
        "engine_id": cache.engine_id,
        "engine_sha256": cache.engine_sha256,
        "gpu_sku": cache.gpu_sku,
        "compute_capability": cache.compute_capability,
        "rtx_version": cache.rtx_version,
        "cuda_version": cache.cuda_version,
        "sha256": cache.sha256,
        "blake3": cache.blake3,
        "size_bytes": cache.size_bytes,
        "created_at": cache.created_at.isoformat() if cache.created_at else None,
        "actor": cache.actor,
        "host": cache.host,
    }
