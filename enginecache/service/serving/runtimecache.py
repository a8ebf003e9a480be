"""The TensorRT-RTX runtime cache a serving load hands to the runtime: from a pulled folder (the
manifest's `runtime_cache`) or from the catalog (`runtime_caches`: the ORM path of `load_or_build`,
and its stdlib hit path, which reads the rows in its own transaction: `for_hit`).

Each answer is a file path or None, and None is always safe (the engine compiles its kernels as if
no cache existed). A cache is handed over only where `core.runtimecache`'s rule allows it for this
host (checked again here: the folder may have been pulled for another host) and its bytes match
their recorded sha256 and BLAKE3; otherwise the reason is logged and nothing is handed over. The
hand-over itself is `core/backends/trt/runtimecache.py` (`LoadSpec.runtime_cache`), which needs an
RTX GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from enginecache.core.runtimecache import CacheTarget, has_runtime_caches, host_target, refusal, select
from enginecache.errors import EngineCacheError

if TYPE_CHECKING:
    from enginecache.db.models import EngineRecord
    from enginecache.service.context import AppContext


def _warn(cache: object, reason: object) -> None:
    import logging

    logging.getLogger(__name__).warning("runtime cache %s not handed over: %s", cache, reason)


def _this_host(engine_sha256: str) -> CacheTarget | None:
    from enginecache.core.fingerprint import host_fingerprint

    return host_target(engine_sha256, host_fingerprint())


def _checked(path: Path, sha256: str, blake3: str | None) -> str | None:
    from enginecache.core.hashing import check_file

    try:
        check_file(path, sha256=sha256, blake3_digest=blake3)
    except (OSError, EngineCacheError) as err:
        _warn(path, err)
        return None
    return str(path)


def for_pulled(home: Path, manifest: dict[str, Any], *, host: CacheTarget | None = None) -> str | None:
    """The runtime cache a pull manifest names, under the pulled folder `home`, where the rule allows
    it for `host` (default: this host) and its bytes are whole; else None."""
    entry = manifest.get("runtime_cache")
    engine = manifest.get("engine") or {}
    if not entry or not has_runtime_caches(str(engine.get("backend"))):
        return None
    target = host if host is not None else _this_host(str(engine.get("sha256")))
    cache = CacheTarget(
        str(entry.get("engine_sha256")),
        str(entry.get("gpu_sku")),
        str(entry.get("compute_capability")),
        str(entry.get("rtx_version")),
        str(entry.get("cuda_version")),
    )
    reason = "this host's GPU, TensorRT-RTX or CUDA version is unknown" if target is None else refusal(cache, target)
    if reason is not None:
        _warn(entry.get("sha256"), reason)
        return None
    return _checked(home / str(entry["blob"]), str(entry["sha256"]), entry.get("blake3"))


def for_hit(home: str, rows: list[Any], host: CacheTarget | None) -> str | None:
    """The hit path's answer: the best of `rows` (an engine's `runtime_caches`, as
    `service.serving.hitpath.CacheRow`s) the rule allows for
    `host` (its `host_target`; None: no cache), brought into the store where it is not here (as an
    engine blob is, within the store cache's budget) and checked; else None. The same rule and checks
    as `for_catalog_engine`."""
    chosen = select(rows, host) if host is not None and rows else None
    if chosen is None:
        return None
    from enginecache.core.blobpaths import blob_file
    from enginecache.core.diskbudget import fetch_within_budget

    try:
        fetch_within_budget(home, chosen.sha256, chunk_blake3=chosen.chunk_blake3 or None)
    except EngineCacheError as err:
        _warn(chosen.sha256, err)
        return None
    return _checked(Path(blob_file(home, chosen.sha256)), chosen.sha256, chosen.blake3)


def for_catalog_engine(app: AppContext, engine: EngineRecord, *, host: CacheTarget | None = None) -> str | None:
    """The best runtime cache of a catalog engine the rule allows for `host` (default: this host),
    fetched into the store where it is not here and checked; else None (also for a non-RTX engine)."""
    from sqlmodel import col
    from sqlmodel import select as sql_select

    from enginecache.db.models import RuntimeCacheRecord

    if not has_runtime_caches(engine.backend) or not engine.sha256:
        return None
    target = host if host is not None else _this_host(engine.sha256)
    if target is None:
        return None
    query = (
        sql_select(RuntimeCacheRecord)
        .where(RuntimeCacheRecord.engine_id == engine.id)
        .order_by(col(RuntimeCacheRecord.created_at).desc(), col(RuntimeCacheRecord.id).desc())
    )
    with app.catalog.read() as session:
        chosen = select(list(session.exec(query).all()), target)
    if chosen is None:
        return None
    try:
        fetched = app.store.fetch(chosen.sha256, size=chosen.size_bytes, chunk_blake3=chosen.chunk_blake3 or None)
    except EngineCacheError as err:
        _warn(chosen.sha256, err)
        return None
    return _checked(fetched.path, chosen.sha256, chosen.blake3)
