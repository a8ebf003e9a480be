"""Copying what one catalog snapshot references into a backup folder, each file hashed as it is copied
and compared with its digest (a model bundle by the model digest's own rule). A READY engine's blob
or an OK model's bundle that is missing or damaged fails the backup (it names the blob); another
engine's blob (CORRUPT, RETIRED), a CORRUPT model's bundle or a blob a job's payload names that is
gone or damaged is left out and listed under the manifest's `skipped`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from enginecache.core.blobpaths import is_digest
from enginecache.core.hashing import DigestResult
from enginecache.core.store import ArtifactStore
from enginecache.db.models import EngineStatus
from enginecache.errors import IntegrityCheckError
from enginecache.service.maintenance.backup.database import CORRUPT, CatalogState, EngineRef, ModelRef
from enginecache.service.maintenance.backup.files import bundle_digest, bundle_file, copy_hashed, remove_tree

logger = logging.getLogger(__name__)


def copy_blobs(
    store: ArtifactStore, state: CatalogState, work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copy each blob the snapshot references once, verified: the engines' (a READY engine's is
    required), those job payloads name and runtime caches' (where the store has them). Returns the manifest's entries
    and what was left out."""
    engines: dict[str, list[EngineRef]] = {}
    for engine in state.engines:
        engines.setdefault(engine.sha256, []).append(engine)
    copied: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for sha256 in sorted({*engines, *state.job_blobs, *state.runtime_cache_blobs}):
        refs = engines.get(sha256, [])
        jobs = state.job_blobs.get(sha256, [])
        caches = state.runtime_cache_blobs.get(sha256, [])
        names: dict[str, Any] = {"engine_ids": [r.engine_id for r in refs], "job_ids": jobs}
        if caches:
            names["runtime_cache_ids"] = caches
        required = any(ref.status == EngineStatus.READY for ref in refs)
        what = _blob_words(sha256, refs, jobs, caches)
        if not is_digest(sha256):
            if required:
                raise IntegrityCheckError(f"{what}: the catalog's digest is not a sha256")
            skipped.append({"sha256": sha256, **names, "reason": "the recorded digest is not a sha256"})
            continue
        source = store.blob_path(sha256)
        relative = store.relative(source)
        try:
            got = copy_hashed(source, work / relative)
        except FileNotFoundError as err:
            if required:
                raise IntegrityCheckError(
                    f"{what} is missing from the store ({source}); `enginecache verify --all` marks its engine CORRUPT"
                ) from err
            if refs or caches:  # a job's payload may name a digest that is no blob (a model's): not reported
                skipped.append({"sha256": sha256, **names, "reason": f"missing from the store ({source})"})
            continue
        if got.sha256 != sha256:
            (work / relative).unlink()
            if required:
                raise IntegrityCheckError(
                    f"{what} at {source} hashes to {got.sha256}: the store's copy is damaged; "
                    "`enginecache verify --all` marks its engine CORRUPT, then back up again"
                )
            skipped.append({"sha256": sha256, **names, "reason": f"damaged in the store (hashes to {got.sha256})"})
            continue
        copied.append({"path": relative, "sha256": sha256, "blake3": got.blake3, "size": got.size, **names})
    for entry in skipped:
        logger.warning(
            "left out of the backup: blob %s (engines %s, jobs %s): %s",
            entry["sha256"],
            entry["engine_ids"],
            entry["job_ids"],
            entry["reason"],
        )
    return copied, skipped


def _blob_words(sha256: str, engines: list[EngineRef], jobs: list[int], caches: list[int]) -> str:
    named = [f"engine {e.engine_id} ({e.status})" for e in engines] + [f"job {job}" for job in jobs]
    named += [f"runtime cache {c}" for c in caches]
    return f"blob {sha256} of {', '.join(named)}"


def copy_models(
    store: ArtifactStore, models: list[ModelRef], work: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Copy each model bundle, every file verified and the bundle checked against the model digest; a
    CORRUPT model's bundle that does not verify is left out. Returns the manifest's entries and what
    was left out."""
    entries: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for model in models:
        try:
            entries.append(_copy_model(store, model, work))
        except IntegrityCheckError as err:
            if model.status != CORRUPT:
                raise
            remove_tree(work / "models" / model.digest)
            skipped.append({"model_id": model.model_id, "digest": model.digest, "reason": str(err)})
            logger.warning("left out of the backup: CORRUPT model %s: %s", model.model_id, err)
    return entries, skipped


def _copy_model(store: ArtifactStore, model: ModelRef, work: Path) -> dict[str, Any]:
    what = f"model {model.model_id} ({model.digest}, {model.status})"
    if not is_digest(model.digest):
        raise IntegrityCheckError(f"{what}: the catalog's digest is not a sha256")
    source_dir = store.model_dir(model.digest)
    files: dict[str, DigestResult] = {}
    listed: list[dict[str, Any]] = []
    for name in dict.fromkeys([model.filename, *model.external]):
        relative = bundle_file(model.digest, name, what)
        try:
            got = copy_hashed(source_dir / name, work / relative)
        except FileNotFoundError as err:
            raise IntegrityCheckError(f"{what}: {source_dir / name} is missing from the store") from err
        files[name] = got
        listed.append({"name": name, "path": relative, "sha256": got.sha256, "size": got.size})
    digest = bundle_digest(model.filename, files)
    if digest != model.digest:
        raise IntegrityCheckError(f"{what}: the bundle at {source_dir} hashes to {digest}: the store's copy is damaged")
    return {"digest": model.digest, "filename": model.filename, "model_id": model.model_id, "files": listed}
