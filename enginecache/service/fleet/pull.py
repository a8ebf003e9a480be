"""Use case: `enginecache pull MODEL --dest DIR`: the engine that fits this host, copied and verified
into DIR with a manifest, as an init container (or NVIDIA NIM's download into its local cache) does
ahead of a serving start.

The engine is the one `service.fleet.profiles` selects for this host among what the serving process
will load (`Wanted`: its backend, precision or pinned engine; never a CPU engine on a host with a
GPU unless allowed), then its GPU first, exact target, the documented precision preference, newest,
through each backend's one compatibility rule. DIR is laid out as a store of its own, so a serving
process reads it as it reads the catalog's store (`service.serving.pulled` loads from it, with no
catalog connection):

    DIR/objects/sha256/<2>/<digest>   the engine blob, read-only
    DIR/manifests/<model>.json        what was pulled and why (`MANIFEST_FORMAT`)
    DIR/objects/sha256/<2>/<digest>   a TensorRT-RTX engine's runtime cache, where one published by
                                      the fleet fits this host (`service.fleet.runtimecaches`; the
                                      manifest's `runtime_cache` names it)
    DIR/bundles/<digest>/             an engine bundle's folder (`service.engines.bundles`), its files
                                      hard links of their blobs in DIR/objects
    DIR/tmp/<digest>.partial          a copy from a store folder in progress (resumed by the next pull)
    DIR/tmp/<digest>.pull/            a download from the object store in progress, its resume state
                                      (core.rangedfetch; resumed by the next pull)
    DIR/gc.lock                       held shared by a pull while its blob lands, exclusive to evict

Idempotent: a manifest that names the same engine, whose blob is in place and hashes to its sha256,
means nothing is copied ("up to date"); a damaged copy is removed and copied again. Resumable: a partial copy
left by a killed pull is hashed and continued (`core.resumable`), and the blob is renamed into place
only once every byte matched its sha256; the manifest is written (atomically) after the blob, so a
manifest never names a blob that is not whole. An engine bundle's files are each brought in the
same way after its manifest blob, then its folder is laid out under a hidden name and renamed into
place, and only then is the pull manifest written (naming the folder): a pull killed half way leaves
no folder and no manifest. The source is the catalog's store folder where this host has it (a
shared volume), else the object store (`ENGINECACHE_STORE`, docs/store.md), read by
parallel ranged GETs, each chunk verified as it lands; a killed download resumes with the chunks it
lacks (`ArtifactStore.fetch`, core.rangedfetch), and leaves nothing outside its resume state.

A disk budget (`max_bytes`, `pull --max-bytes N`; an engine bundle counts its manifest and every
file, and its folder goes with the last manifest naming it): the blobs in DIR are kept within N bytes by
evicting the least recently loaded blobs that no manifest names, with `core.diskbudget`'s contract
(never one a live process has loaded, never one a manifest names, so never the one this pull
selects); room is made before the copy and the rest evicted once the manifest is written
(`PullResult.evicted`). A budget the selected engine does not fit, beside the blobs the other
manifests name, is BadInputError before anything is copied or removed.

Where trusted keys are configured (`core.signing`), the selected engine's signed statement is checked
against its row and the model asked for before anything is copied (a row that no longer says what
was signed is marked TAMPERED), and the manifest carries the statement and signature, which the
serving start checks again (`service.serving.pulled`).

Exit codes (the CLI's, enginecache.errors): 0 pulled or up to date; 1 no engine of the model fits
this host (each engine's reason in the message), the selected engine is TAMPERED or UNTRUSTED, or
the source blob does not match its digest; 2 an
unknown model or a bad argument (a budget the engine does not fit); 3 the catalog or the store cannot be reached.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enginecache.core.blobpaths import blob_path, blob_relative
from enginecache.core.diskbudget import EvictionReport, Landing, parse_size
from enginecache.core.enginebundle import BundleError, folder_matches, parse_manifest
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.hashing import hash_file, verify_file
from enginecache.core.names import check_model_name
from enginecache.core.resumable import copy_resumable
from enginecache.core.signing import policy
from enginecache.core.store import ArtifactStore
from enginecache.core.storeenv import configured as remote_configured
from enginecache.db.models import EngineRecord, RuntimeCacheRecord
from enginecache.errors import IntegrityCheckError, NoEngineFitsError, StoreError
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import bundle_manifest_anywhere, is_bundle, place_files
from enginecache.service.engines.records import get_engine
from enginecache.service.engines.signatures import check_row
from enginecache.service.fleet.profiles import Profile, Wanted, model_profiles
from enginecache.service.fleet.runtimecaches import (
    best_for_host,
    has_runtime_caches,
    host_target,
    land_runtime_cache,
    manifest_entry,
)
from enginecache.service.models.register import get_model
from enginecache.service.models.releases import AliasTarget, version_of
from enginecache.service.serving.pulled import MANIFEST_FORMAT


@dataclass(frozen=True)
class PullResult:
    dest: Path
    manifest_path: Path
    engine_id: int
    sha256: str
    copied_bytes: int
    up_to_date: bool
    manifest: dict[str, Any]
    evicted: EvictionReport | None = None  # with a disk budget: what it evicted, and what it could not

    def to_dict(self) -> dict[str, Any]:
        budget = {} if self.evicted is None else {"evicted": self.evicted.to_dict()}
        return {
            "dest": str(self.dest),
            "manifest": str(self.manifest_path),
            "engine_id": self.engine_id,
            "sha256": self.sha256,
            "copied_bytes": self.copied_bytes,
            "up_to_date": self.up_to_date,
            "blob": self.manifest["blob"],
            **budget,
        }


def manifest_path(dest: Path, model_name: str) -> Path:
    return dest / "manifests" / f"{check_model_name(model_name)}.json"


def _profile_line(p: Profile) -> str:
    return f"engine {p.engine_id} ({p.backend} {p.precision} {','.join(p.targets)}): {p.reason}"


def _no_fit(model: str, host: HostFingerprint, profiles: tuple[Profile, ...], wanted: Wanted) -> str:
    asked = f" ({wanted.describe()})"
    if not profiles:
        return f"model {model!r} has no engines: build one for this host first"
    lines = "; ".join(_profile_line(p) for p in profiles)
    gpus = sorted({gpu.compute_capability for gpu in host.gpus})
    lacking = ""
    if gpus and not wanted.allow_cpu and not any(p.on_gpu for p in profiles if p.status == "READY"):
        lacking = (
            f"; this host's GPU ({', '.join(gpus)}) has no engine: build one for it, or pass --allow-cpu "
            "to take an engine for its CPU"
        )
    return f"no engine of model {model!r}{asked} fits this host ({host.hostname}){lacking}: {lines}"


def _manifest(
    app: AppContext, engine: EngineRecord, profile: Profile, host: HostFingerprint, release: AliasTarget | None
) -> dict[str, Any]:
    model = get_model(app, engine.model_id)
    return {
        "format": MANIFEST_FORMAT,
        "model": {"id": model.id, "name": model.name, "digest": model.digest},
        "engine": {
            "id": engine.id,
            "backend": engine.backend,
            "backend_version": engine.backend_version,
            "precision": engine.precision,
            "targets": list(profile.targets),
            "cache_key": engine.cache_key,
            "key_ingredients": engine.key_ingredients,
            "build_options": engine.build_options,
            "io": engine.io,
            "sha256": engine.sha256,
            "blake3": engine.blake3,
            "header_blake3": engine.header_blake3,
            "chunk_blake3": engine.chunk_blake3,
            "size_bytes": engine.size_bytes,
            "signed_statement": engine.signed_statement,  # core.signing: a serving start checks it again
            "signature": engine.signature,
        },
        "blob": blob_relative(engine.sha256),
        "selected_for": {"host": host.hostname, "reason": profile.reason},
        "release": {
            "alias": release.alias if release else None,
            "gpu_class": release.gpu_class if release else None,
            "version": version_of(app, model),
        },
        "pulled_at": datetime.now(UTC).isoformat(),
    }


def _up_to_date(path: Path, engine: EngineRecord, blob: Path) -> bool:
    """The manifest names this engine and its blob is whole (re-hashed: a damaged copy is removed,
    so this pull copies it again)."""
    try:
        existing = json.loads(path.read_text())
        named = (
            existing.get("format") == MANIFEST_FORMAT
            and existing["engine"]["sha256"] == engine.sha256
            and existing["engine"].get("signature") == engine.signature  # signed since: the manifest is rewritten
        )
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not named or not blob.is_file():
        return False
    if _whole(blob, engine):
        return True
    blob.unlink()
    return False


def _cache_in_place(manifest: dict[str, Any], dest: Path, cache: RuntimeCacheRecord | None) -> bool:
    """The manifest names `cache` (or no cache, where there is none) and its blob is in `dest`."""
    named = manifest.get("runtime_cache") or {}
    if cache is None:
        return not named
    return named.get("sha256") == cache.sha256 and (dest / str(named.get("blob"))).is_file()


def _land_cache(app: AppContext, cache: RuntimeCacheRecord | None, dest: Path, manifest: dict[str, Any]) -> int:
    """`cache`'s blob brought into `dest` and named in `manifest` (none named where `cache` is None);
    the bytes copied."""
    if cache is None:
        manifest.pop("runtime_cache", None)
        return 0
    copied = land_runtime_cache(app, cache, dest)
    manifest["runtime_cache"] = manifest_entry(cache)
    return copied


def _whole(blob: Path, engine: EngineRecord) -> bool:
    """Whether `blob` hashes to the engine's digest: its BLAKE3 where recorded (the faster of the
    two, the one a load verifies with, on every core), else its sha256; one hash, not both
    (`core.hashing.verify_file`, which a load's check in place uses too)."""
    try:
        verify_file(blob, blake3_digest=engine.blake3 or None, sha256=None if engine.blake3 else engine.sha256)
    except IntegrityCheckError:
        return False
    return True


def _bundle_folder(sha256: str) -> str:
    return f"bundles/{sha256}"


def _bundle_in_place(dest: Path, engine: EngineRecord, final: Path) -> bool:
    """For an engine bundle, whether its folder in `dest` holds exactly its files, each matching its
    manifest (a damaged folder is removed, so this pull places it again); True for one file."""
    if not is_bundle(engine):
        return True
    folder = dest / _bundle_folder(str(engine.sha256))
    if not folder.is_dir():
        return False
    try:
        folder_matches(folder, parse_manifest(final.read_bytes()), f"engine {engine.id}")
    except (IntegrityCheckError, BundleError):
        shutil.rmtree(folder, ignore_errors=True)
        return False
    return True


def _blob_sizes(
    app: AppContext, engine: EngineRecord, cache: RuntimeCacheRecord | None, landing: Landing
) -> dict[str, int]:
    """The blobs a pull of `engine` puts in the folder (digest -> bytes): its blob, its runtime
    `cache`'s, and for an engine bundle under a budget each file's too (from its verified manifest,
    read where it lies)."""
    blobs = {str(engine.sha256): int(engine.size_bytes or 0)}
    if cache is not None:
        blobs[cache.sha256] = cache.size_bytes
    if is_bundle(engine) and landing.max_bytes is not None:
        blobs.update((entry.sha256, entry.size) for entry in bundle_manifest_anywhere(app, engine).files)
    return blobs


def _pull_bundle(app: AppContext, engine: EngineRecord, dest: Path, final: Path, manifest: dict[str, Any]) -> int:
    """Bring every file of bundle `engine` (its verified manifest blob at `final`) into `dest`'s
    objects, each verified (one already there is hashed, and copied again where damaged), then lay
    its folder out (`service.engines.bundles.place_files`: all files or no folder) and name it in the
    pull `manifest`; the bytes copied."""
    bundle = parse_manifest(final.read_bytes())
    copied = 0
    for entry in bundle.files:
        landed = dest / blob_relative(entry.sha256)
        source = blob_path(app.home, entry.sha256)
        if landed.is_file():
            if hash_file(landed).sha256 == entry.sha256:
                continue
            landed.unlink()  # damaged (through the folder's hard link, say): copied again
        if not source.is_file() and remote_configured():
            fetched = ArtifactStore(dest).fetch(
                entry.sha256, size=entry.size, chunk_blake3=entry.chunk_blake3, mode=0o444
            )
            copied += fetched.fetched_bytes
        else:
            partial = dest / "tmp" / f"{entry.sha256}.partial"
            copied += copy_resumable(source, landed, partial, sha256=entry.sha256)
    folder = dest / _bundle_folder(str(engine.sha256))
    if folder.is_dir():
        shutil.rmtree(folder)
    place_files(bundle, dest, folder, label=f"engine {engine.id}")
    manifest["bundle"] = {
        "dir": _bundle_folder(str(engine.sha256)),
        "files": [f.to_dict() for f in bundle.files],
        "ranks": [f.path for f in bundle.ranks],
    }
    return copied


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as stream:
            json.dump(data, stream, indent=2, sort_keys=True, default=str)
            stream.write("\n")
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def max_bytes_option(text: str) -> int:
    """`pull --max-bytes`'s value in bytes: a number, or one with K, M, G or T (`20G`); BadInputError
    otherwise."""
    return parse_size(text, "--max-bytes")


def pull(
    app: AppContext,
    model_ref: str | int,
    dest: Path,
    *,
    wanted: Wanted | None = None,
    host: HostFingerprint | None = None,
    max_bytes: int | None = None,
) -> PullResult:
    """Copy the engine that fits this host into `dest` (module docstring), within `max_bytes` where
    given. Raises NoEngineFitsError when none does, NotFoundError for an unknown model, BadInputError
    for a budget the engine does not fit, IntegrityCheckError where the source blob does not match
    its digest, StoreError where it cannot be read or `dest` written."""
    landing = Landing(str(dest), max_bytes, name="--max-bytes")
    try:
        result = _pull(app, model_ref, dest, landing, wanted=wanted, host=host)
    finally:
        landing.release()
    evicted = landing.finish()
    return result if evicted is None else replace(result, evicted=evicted)


def _pull(
    app: AppContext,
    model_ref: str | int,
    dest: Path,
    landing: Landing,
    *,
    wanted: Wanted | None = None,
    host: HostFingerprint | None = None,
) -> PullResult:
    """`pull` with the folder's `landing`, admitted once the engine is chosen."""
    host, wanted = host or host_fingerprint(), wanted or Wanted()
    found = model_profiles(app, model_ref, wanted=wanted, host=host)
    chosen = found.selected
    if chosen is None:
        raise NoEngineFitsError(_no_fit(found.model, host, found.profiles, wanted))
    engine = get_engine(app, chosen.engine_id)
    checks = policy()
    if checks is not None:  # before anything is copied: a TAMPERED row is marked, an untrusted one refused
        requested = get_model(app, found.model_id)
        asked = {"model.digest": requested.digest, "model.name": requested.name}
        check_row(app, engine, checks, by="pull", request=asked)
    sha256 = str(engine.sha256)
    manifest = _manifest(app, engine, chosen, host, found.release)
    final = dest / manifest["blob"]
    where = manifest_path(dest, found.model)
    # the runtime cache core.runtimecache allows this host, if any (TensorRT-RTX engines)
    cache = (
        best_for_host(app, chosen.engine_id, host_target(sha256, host)) if has_runtime_caches(engine.backend) else None
    )
    landing.admit(_blob_sizes(app, engine, cache, landing), where.name)  # the budget, before anything moves
    if _up_to_date(where, engine, final) and _bundle_in_place(dest, engine, final):
        kept = json.loads(where.read_text())
        if _cache_in_place(kept, dest, cache):
            return PullResult(dest, where, chosen.engine_id, sha256, 0, True, kept)
        try:  # the engine is in place; a runtime cache published (or removed) since is brought in alone
            copied = _land_cache(app, cache, dest, kept)
            _write_atomically(where, kept)
        except OSError as err:
            raise StoreError(f"could not pull engine {chosen.engine_id}'s runtime cache into {dest}: {err}") from err
        return PullResult(dest, where, chosen.engine_id, sha256, copied, False, kept)
    source = blob_path(app.home, sha256)
    try:
        if not source.is_file() and remote_configured():  # this host has no store folder: the object store
            fetched = ArtifactStore(dest).fetch(  # ranged, verified as it lands, resumable; then renamed
                sha256, size=engine.size_bytes, chunk_blake3=engine.chunk_blake3, mode=0o444
            )
            copied = fetched.fetched_bytes
        else:
            copied = copy_resumable(source, final, dest / "tmp" / f"{sha256}.partial", sha256=sha256)
        if is_bundle(engine):  # every file in DEST's objects, then its folder renamed into place
            copied += _pull_bundle(app, engine, dest, final, manifest)
        copied += _land_cache(app, cache, dest, manifest)
        _write_atomically(where, manifest)
    except OSError as err:
        raise StoreError(f"could not pull engine {chosen.engine_id} into {dest}: {err}") from err
    return PullResult(dest, where, chosen.engine_id, sha256, copied, False, manifest)
