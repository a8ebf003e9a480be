"""A build job's built engine, kept in the job's staging folder (service.jobs.staging) from the moment
it is built and proven loadable until it is published, so that an attempt that fails after the build
(the store's remote unreachable, the catalog down at the READY write, the attempt killed part way
through its upload) leaves the next attempt an engine to publish rather than one to build again.

The folder holds `engine.plan` (the backend's file, moved there from the attempt's work folder: the
same filesystem, no copy) and `engine.json`, written after it, naming the cache key it was built for,
its digests (sha256, BLAKE3, size, header and chunk digests, as `core.hashing.hash_file` gives them:
the one hash pass of attempt 1, which the publish then uses instead of hashing a copy) and what the
READY row records of the build (the backend's log and its proof of loading, tensor I/O, warnings,
the precision variant's model, the build's seconds, the attempt and job that built it).

A later attempt `take`s it only where the record is whole, names the cache key that attempt plans,
and the file hashes to the recorded digests again (one pass); anything else is removed and the engine
is built again, the reason in the job's log.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from enginecache.core.hashing import DigestResult, hash_durable, hash_file
from enginecache.core.store import fsync_dir
from enginecache.errors import StoreError
from enginecache.service.jobs.staging import remove_staging

logger = logging.getLogger(__name__)

ENGINE_NAME = "engine.plan"
RECORD_NAME = "engine.json"
RECORD_VERSION = 1


@dataclass(frozen=True)
class BuiltEngine:
    """An engine a build made, not yet published: its file, its digests where they are known (a staged
    engine's; None for a file the publish hashes as it copies it), and what its READY row records."""

    path: Path
    log: str
    proof: str
    io: list[dict[str, Any]]
    warnings: list[str]
    variant_model_id: int | None
    build_seconds: float
    built_by: tuple[int, int] | None = None  # (job id, attempt) of a job's build
    digest: DigestResult | None = None
    reused: bool = field(default=False, compare=False)  # taken from the staging folder, not built now


@dataclass(frozen=True)
class EngineStaging:
    """Job `job_id`'s staging folder, as attempt `attempt` uses it."""

    folder: Path
    job_id: int
    attempt: int

    def keep(self, built: BuiltEngine, cache_key: str) -> BuiltEngine:
        """Move the built engine into the staging folder, hash it there, and write its record; the
        engine as staged (its path there, its digests). StoreError where the folder cannot be written
        (a full disk: the attempt is retried)."""
        try:
            return self._keep(built, cache_key)
        except OSError as err:
            raise StoreError(f"could not stage the built engine in {self.folder}: {err}") from err

    def _keep(self, built: BuiltEngine, cache_key: str) -> BuiltEngine:
        remove_staging(self.folder)  # an earlier attempt's, for another key or found bad
        self.folder.mkdir(parents=True)
        engine = self.folder / ENGINE_NAME
        os.replace(built.path, engine)
        digest = hash_durable(engine)
        staged = replace(built, path=engine, digest=digest, built_by=(self.job_id, self.attempt))
        record = {
            "version": RECORD_VERSION,
            "cache_key": cache_key,
            "digest": {
                "sha256": digest.sha256,
                "blake3": digest.blake3,
                "size": digest.size,
                "head_blake3": digest.head_blake3,
                "chunk_blake3": digest.chunk_blake3,
            },
            "log": built.log,
            "proof": built.proof,
            "io": built.io,
            "warnings": built.warnings,
            "variant_model_id": built.variant_model_id,
            "build_seconds": built.build_seconds,
            "built_by": [self.job_id, self.attempt],
        }
        partial = self.folder / f"{RECORD_NAME}.partial"
        with open(partial, "w") as out:
            json.dump(record, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.folder / RECORD_NAME)  # the record last: one is there only for a whole file
        fsync_dir(self.folder)
        return staged

    def take(self, cache_key: str, log: Callable[[str], None] | None = None) -> BuiltEngine | None:
        """The engine an earlier attempt of this job built and staged for `cache_key`, its file hashed
        again here and found to be what was recorded; else None (a staged engine that is not is
        removed, the reason logged and given to `log`)."""
        record_path = self.folder / RECORD_NAME
        if not record_path.is_file():
            return None
        try:
            staged = self._read(record_path, cache_key)
        except (OSError, ValueError, KeyError, TypeError) as err:
            self._discard(f"its staged engine cannot be used: {err}", log)
            return None
        if staged is None:
            self._discard("its staged engine was built for another cache key", log)
            return None
        try:
            got = hash_file(staged.path)
        except OSError as err:
            self._discard(f"its staged engine cannot be read: {err}", log)
            return None
        if got != staged.digest:
            self._discard(f"its staged engine hashes to sha256 {got.sha256}, recorded {staged.digest}", log)
            return None
        return staged

    def _read(self, record_path: Path, cache_key: str) -> BuiltEngine | None:
        record = json.loads(record_path.read_text())
        if record["version"] != RECORD_VERSION or record["cache_key"] != cache_key:
            return None
        digest = record["digest"]
        job_id, attempt = record["built_by"]
        return BuiltEngine(
            path=self.folder / ENGINE_NAME,
            log=str(record["log"]),
            proof=str(record["proof"]),
            io=list(record["io"]),
            warnings=[str(w) for w in record["warnings"]],
            variant_model_id=record["variant_model_id"],
            build_seconds=float(record["build_seconds"]),
            built_by=(int(job_id), int(attempt)),
            digest=DigestResult(
                str(digest["sha256"]),
                str(digest["blake3"]),
                int(digest["size"]),
                str(digest["head_blake3"]),
                str(digest["chunk_blake3"]),
            ),
            reused=True,
        )

    def _discard(self, why: str, log: Callable[[str], None] | None) -> None:
        line = f"[staged] job {self.job_id} attempt {self.attempt}: {why}; building again"
        logger.warning("%s", line)
        if log is not None:
            log(line)
        remove_staging(self.folder)
