"""Engine bundles (`core.enginebundle`): an engine of several files imported, verified, and laid out
as a folder.

`import_bundle` (what `engine import FOLDER` runs, through `import_engine_or_bundle`) checks the
folder's layout (`config.json`, one or more `rank<N>.engine`, any other files; no symlinks, no path
leaving the folder), checks every rank
engine's header against the declaration as a single import does (and the ranks against each other),
stores each file as its own blob and the canonical manifest as the engine's blob, and records the
engine UNPROVEN with its provenance (`provenance["bundle"]`: its paths, ranks, total size and the
files' digests, which gc keeps as it keeps the engine's blob), as
`service.engines.importing` does for one file. A refusal stores no manifest and records nothing.

`verify_bundle` checks the manifest blob against the catalog and every file's blob against the
manifest (size, sha256, BLAKE3). `place_bundle` lays the bundle out as a folder at a destination:
each file hard-linked from the store (copied across filesystems) into a hidden sibling folder and
hashed against the manifest, the folder then renamed into place, so the destination holds every file
or does not exist; a stale hidden folder a killed process left is removed by the next call.
`bundle_path` answers the verified folder (or one rank file) under the home's `bundles/`, for
runtimes that load a folder (TensorRT-LLM); whether a host can load it is not proven here.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from enginecache.core.backends.headerfacts import HeaderFacts, read_header_facts
from enginecache.core.blobpaths import blob_path
from enginecache.core.enginebundle import (
    RANK_FILE,
    BundleError,
    BundleFile,
    BundleManifest,
    check_entry,
    folder_matches,
    parse_manifest,
    scan_folder,
)
from enginecache.core.hashing import HEAD_BYTES, check_file, head_digest
from enginecache.core.profiles import parse_profile_args, resolve_profile
from enginecache.core.store import fsync_dir
from enginecache.db.models import EngineRecord
from enginecache.errors import BadInputError, ImportRefusedError, IntegrityCheckError
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.engines.importing import (
    ImportRequest,
    ImportResult,
    _backend_version,
    _targets,
    checked_declaration,
    import_engine,
    record_import,
)
from enginecache.service.models.register import model_inputs

logger = logging.getLogger(__name__)

BUNDLES_DIR = "bundles"  # under the home: the verified folders `bundle_path` answers
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


def is_bundle(engine: EngineRecord) -> bool:
    """Whether `engine` is an engine bundle (its blob is a manifest)."""
    return bool((engine.provenance or {}).get("bundle"))


def import_engine_or_bundle(app: AppContext, request: ImportRequest) -> ImportResult:
    """`engine import PATH`: a folder imported as a bundle (`import_bundle`), a file as one engine
    (`service.engines.importing.import_engine`)."""
    path = Path(request.path)
    if path.is_dir() and not path.is_symlink():
        return import_bundle(app, request)
    return import_engine(app, request)


def import_bundle(app: AppContext, request: ImportRequest) -> ImportResult:
    """Check, store and record the bundle folder `request.path` (module docstring). Raises BundleError
    (a layout that is no bundle), ImportRefusedError (a rank engine refused as a single import would
    be, or ranks that disagree), BadInputError and AccessDeniedError as `import_engine` does."""
    access.require(app, "import")
    root = Path(request.path)
    listed = scan_folder(root)
    model, backend, declared = checked_declaration(app, request)

    heads: dict[str, bytes] = {}
    proven: list[tuple[str, HeaderFacts, tuple[str, ...], str | None]] = []
    for relative, full in listed:
        if not RANK_FILE.match(relative):
            continue
        with open(full, "rb") as stream:
            heads[relative] = stream.read(HEAD_BYTES)
        if not heads[relative]:
            raise ImportRefusedError(f"{full} is empty: not a {backend.label} engine")
        facts = read_header_facts(backend, heads[relative])
        if facts.refusal is not None:
            raise ImportRefusedError(f"{full} is refused: {facts.refusal}")
        targets = _targets(backend, full, declared, facts)
        version = _backend_version(backend, full, request.backend_version, facts)
        proven.append((relative, facts, targets, version))
    first, facts, targets, backend_version = proven[0]
    for relative, _, other_targets, other_version in proven[1:]:
        if set(other_targets) != set(targets) or other_version != backend_version:
            raise ImportRefusedError(
                f"the bundle's rank engines disagree: {first} is {backend.show_targets(targets)} "
                f"{backend_version or '(version unknown)'}, {relative} is {backend.show_targets(other_targets)} "
                f"{other_version or '(version unknown)'}"
            )
    profile = (
        resolve_profile(model_inputs(model), parse_profile_args(request.profiles)).to_dict()
        if request.profiles
        else None
    )

    files = []
    for relative, full in listed:
        stored = app.store.ingest_file(full)
        if relative in heads and stored.head_blake3 and stored.head_blake3 != head_digest(heads[relative]):
            raise ImportRefusedError(f"{full} changed while it was imported (its first bytes are not those checked)")
        files.append(
            BundleFile(
                path=relative,
                size=stored.size,
                sha256=stored.sha256,
                blake3=stored.blake3,
                chunk_blake3=stored.chunk_blake3,
            )
        )
    manifest = BundleManifest(tuple(files))
    blob = app.store.write_blob([manifest.to_bytes()])
    summary: dict[str, Any] = {
        "files": [f.path for f in manifest.files],
        "ranks": [f.path for f in manifest.ranks],
        "size_bytes": manifest.size,
        "blobs": sorted({f.sha256 for f in manifest.files}),  # what gc keeps while the engine needs it
    }
    result = record_import(
        app, request, model, backend, declared, facts, targets, backend_version, profile, blob, bundle=summary
    )
    logger.info("engine %s is a bundle of %d files (%d ranks)", result.engine_id, len(files), len(manifest.ranks))
    return result


def read_manifest(app: AppContext, engine: EngineRecord) -> BundleManifest:
    """The verified manifest of bundle `engine`: IntegrityCheckError where its blob does not hash to
    the catalog's digests, BundleError where `engine` is no bundle."""
    if not is_bundle(engine) or not engine.sha256:
        raise BundleError(f"engine {engine.id} is not an engine bundle")
    path = blob_path(app.home, engine.sha256)
    if not path.is_file():
        raise IntegrityCheckError(f"engine {engine.id}: its bundle manifest {engine.sha256} is missing from the store")
    check_file(path, sha256=engine.sha256, blake3_digest=engine.blake3)
    return parse_manifest(path.read_bytes())


def bundle_manifest_anywhere(app: AppContext, engine: EngineRecord) -> BundleManifest:
    """The verified manifest of bundle `engine` from the home's store where it is there
    (`read_manifest`), else read from the object store into memory (it is small) and checked against
    the catalog's sha256: what a pull needs to know of a bundle's files before it copies any."""
    if blob_path(app.home, str(engine.sha256)).is_file() or app.store.remote is None:
        return read_manifest(app, engine)
    if not is_bundle(engine) or not engine.sha256:
        raise BundleError(f"engine {engine.id} is not an engine bundle")
    data = bytes(app.store.remote.read_range(engine.sha256, 0, int(engine.size_bytes or 0)))
    got = hashlib.sha256(data).hexdigest()
    if got != engine.sha256:
        raise IntegrityCheckError(
            f"engine {engine.id}: its bundle manifest in {app.store.remote.describe()} hashes to {got}, "
            f"the catalog says {engine.sha256}"
        )
    return parse_manifest(data)


def verify_bundle(app: AppContext, engine: EngineRecord) -> BundleManifest:
    """Check bundle `engine`'s manifest and every file it lists (size, sha256, BLAKE3); its manifest.
    IntegrityCheckError names the first file that is missing or does not match."""
    manifest = read_manifest(app, engine)
    for entry in manifest.files:
        path = blob_path(app.home, entry.sha256)
        if not path.is_file():
            raise IntegrityCheckError(f"engine {engine.id}: {entry.path} (blob {entry.sha256}) is missing")
        check_entry(path, entry, f"engine {engine.id}")
    return manifest


def place_bundle(
    app: AppContext,
    engine: EngineRecord,
    dest: Path,
    *,
    on_file: Callable[[str], None] | None = None,
) -> Path:
    """Lay bundle `engine` out as the folder `dest` from the home's store (`place_files`)."""
    return place_files(read_manifest(app, engine), app.home, dest, label=f"engine {engine.id}", on_file=on_file)


def place_files(
    manifest: BundleManifest,
    objects_home: Path,
    dest: Path,
    *,
    label: str,
    on_file: Callable[[str], None] | None = None,
) -> Path:
    """Lay `manifest`'s files, read from the blobs under `objects_home`, out as the folder `dest`
    (module docstring: all files or no folder). `dest` must not exist. `on_file(path)` runs after
    each file is placed (a test's crash point). Raises IntegrityCheckError (a file missing or not
    matching its manifest, named with `label`), BadInputError (`dest` exists); the hidden folder is
    removed then."""
    dest = Path(dest)
    if dest.exists() or dest.is_symlink():
        raise BadInputError(f"{dest} exists; a bundle is placed only where nothing is")
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(dest)
    temp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        for entry in manifest.files:
            target = temp / entry.path
            target.parent.mkdir(parents=True, exist_ok=True)
            source = blob_path(objects_home, entry.sha256)
            if not source.is_file():
                raise IntegrityCheckError(f"{label}: {entry.path} (blob {entry.sha256}) is missing")
            try:
                os.link(source, target)
            except OSError as err:
                if err.errno not in _NO_LINK:
                    raise
                shutil.copyfile(source, target)
            check_entry(target, entry, label)
            if on_file is not None:
                on_file(entry.path)
        fsync_dir(temp)
        os.rename(temp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return dest


def _remove_stale(dest: Path) -> None:
    """Remove hidden folders a killed `place_bundle` of `dest` left (their process is gone)."""
    for stale in dest.parent.glob(f".{dest.name}.*.partial"):
        pid_text = stale.name[len(dest.name) + 2 : -len(".partial")]
        if pid_text.isdigit() and not _alive(int(pid_text)):
            shutil.rmtree(stale, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def bundle_path(app: AppContext, engine: EngineRecord, rank: int | None = None) -> Path:
    """The verified folder of bundle `engine` under the home's `bundles/` (placed on first use, each
    file hashed against the manifest on every call), or its `rank<N>.engine` where `rank` is named.
    Raises IntegrityCheckError (a file that does not match; a damaged folder is removed, placed again
    on the next call), BundleError (no such rank, no bundle)."""
    manifest = read_manifest(app, engine)
    folder = app.home / BUNDLES_DIR / (engine.sha256 or "")
    if not folder.is_dir():
        place_bundle(app, engine, folder)
    else:
        try:
            folder_matches(folder, manifest, f"engine {engine.id}")
        except (IntegrityCheckError, BundleError):
            shutil.rmtree(folder, ignore_errors=True)
            raise
    if rank is None:
        return folder
    name = f"rank{rank}.engine"
    manifest.file(name)
    return folder / name
