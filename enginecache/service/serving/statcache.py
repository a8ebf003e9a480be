"""The ONNX digest of a model file on a serving host, from a stat cache in the catalog.

A multi-GB model is not re-hashed on every service start: the digest is cached per (host, path)
with the (size, mtime_ns, ctime_ns, inode) of the model and of each external data file, and trusted
only while all of them still match; a changed file is re-hashed, never trusted.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import select

from enginecache.core.fingerprint import HostFingerprint
from enginecache.core.onnx_info import inspect_model
from enginecache.core.pathtext import absolute_text
from enginecache.core.signing import stat_receipts
from enginecache.db.models import StatCacheRecord, utcnow
from enginecache.errors import EngineCacheError
from enginecache.service.context import AppContext
from enginecache.service.serving.localhost import local_host
from enginecache.service.serving.statrule import RACY_WINDOW_NS, cached_files_match, stat_entry

logger = logging.getLogger(__name__)

__all__ = ["RACY_WINDOW_NS", "DigestLookup", "onnx_digest"]


@dataclass(frozen=True)
class DigestLookup:
    digest: str
    stat_cache_hit: bool
    seconds: float


def onnx_digest(app: AppContext, onnx_path: Path, *, host: HostFingerprint | None = None) -> DigestLookup:
    """The model digest (model plus external data) from the stat cache, or hashed and cached.

    Trusted only when the model file and every external data file it had still show the same
    size, mtime_ns, ctime_ns and inode, and the entry is not racy; otherwise re-hashed.
    """
    started = time.perf_counter()
    path = Path(absolute_text(onnx_path))  # str(path) is the key; the hit path computes it without pathlib
    hostname = (host or local_host()).hostname
    try:
        model_stat = stat_entry(path)
    except OSError as err:
        raise EngineCacheError(f"cannot read ONNX model {path}: {err}") from err
    with app.catalog.read() as session:
        row = session.exec(
            select(StatCacheRecord).where(StatCacheRecord.hostname == hostname, StatCacheRecord.path == str(path))
        ).first()
    vouching = stat_receipts()
    if row is not None and cached_files_match(path, model_stat, row.files, row.racy):
        if vouching is None or vouching.holds_digest(hostname, str(path), row.files, row.digest):
            return DigestLookup(row.digest, True, time.perf_counter() - started)
        logger.info("stat cache entry for %s has no receipt of this user's hash: hashing it again", path)
    hash_started_ns = time.time_ns()
    info = inspect_model(path)  # hashes the model and its external data in one defined order
    files = [stat_entry(path)] + [stat_entry(path.parent / name) for name in info.external_data_files]
    if files[0] != model_stat:
        # Changed while we hashed: the digest may mix versions; use it, cache nothing.
        logger.warning("%s changed while it was hashed; not caching its digest", path)
        return DigestLookup(info.digest, False, time.perf_counter() - started)
    racy = any(hash_started_ns - int(entry[2]) < RACY_WINDOW_NS for entry in files)
    _store_stat(app, hostname, path, files, info.digest, racy)
    if vouching is not None:
        vouching.add_digest(hostname, str(path), files, info.digest)
    return DigestLookup(info.digest, False, time.perf_counter() - started)


def _store_stat(app: AppContext, hostname: str, path: Path, files: list[list[Any]], digest: str, racy: bool) -> None:
    try:
        with app.catalog.write() as session:
            row = session.exec(
                select(StatCacheRecord).where(StatCacheRecord.hostname == hostname, StatCacheRecord.path == str(path))
            ).first()
            row = row or StatCacheRecord(
                hostname=hostname, path=str(path), size_bytes=0, mtime_ns=0, inode=0, digest=""
            )
            row.size_bytes, row.mtime_ns, row.inode = int(files[0][1]), int(files[0][2]), int(files[0][4])
            row.files, row.digest, row.racy, row.hashed_at = files, digest, racy, utcnow()
            session.add(row)
    except sa.exc.IntegrityError:
        logger.debug("stat cache entry for %s written concurrently", path)
