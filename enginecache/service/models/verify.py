"""Model bundles' integrity: re-hash a stored bundle, mark the model CORRUPT or OK, repair it.

A model's digest (`core.onnx_info.model_digest`) covers the model file and every external data file
it names, so re-hashing the stored bundle (`models/<digest>/`, the path the digest implies, never the
catalog's `store_path`) with the same function, one streaming pass per file, says whether the bytes a
build would read are the bytes that were registered. Three callers:

- `enginecache verify` (`verify_models`): every source model and converted variant; a mismatch or a
  missing file marks the model CORRUPT, a bundle that hashes right again sets it back to OK;
- a build (`service.builds.plan`) and a test-load's accuracy reference (`service.builds.testload`) read
  the bundle as `stage_bundle` puts it in their work folder, hashed in the same pass, a mismatch refused
  with the model and digest named: the bytes a converter, a backend or ONNX Runtime reads are the bytes
  that were verified. A test-load reads a copy (a change to the store after the check cannot reach it);
  a build's backend reads the stored files themselves through hard links, under read leases checked
  once it is done (a change breaks a lease and fails the build), so a multi-GB model is not copied
  (a converter, which loads the model with onnx, reads a copy: onnx refuses hard-linked external data);
- `register_model` of bytes already registered (`restore_bundle`): a damaged or missing stored bundle is
  rewritten from the given file (staged on the store's filesystem and hashed there first, then each
  file renamed into place) and the model set back to OK.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.core.blobpaths import model_dir, model_file
from enginecache.core.chunkdigests import check_file_chunks
from enginecache.core.filelease import ReadLease, take_read_lease
from enginecache.core.hashing import DigestResult, copy_hashed, hash_file
from enginecache.core.onnx_info import model_digest
from enginecache.core.store import fsync_dir
from enginecache.db.models import ModelRecord, ModelStatus
from enginecache.errors import ExternalDataError, IntegrityCheckError, StoreError
from enginecache.service.access import audit
from enginecache.service.context import AppContext

logger = logging.getLogger(__name__)

# What a missing (or replaced by a folder) stored file raises while it is hashed: the bundle is damaged.
_MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)

# Hashes one file of a bundle (path, relpath as the digest names it): `core.onnx_info.model_digest`'s `read`.
DigestReader = Callable[[Path, str], DigestResult]
# An ExitStack exit callback: (exception type, exception, traceback) -> whether it suppresses it.
ExitCallback = Callable[[type[BaseException] | None, BaseException | None, Any], bool]
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def bundle_files(model: ModelRecord) -> tuple[str, ...]:
    """The external data files the model's digest covers (relative names, as registered)."""
    return tuple(str(name) for name in model.info.get("external_data_files") or ())


def bundle_path(app: AppContext, model: ModelRecord) -> Path:
    """The stored model file, derived from the digest (`models/<digest>/<file name>`)."""
    return model_file(app.home, model.digest, model.filename)


def _label(model: ModelRecord) -> str:
    return f"model {model.id} ({model.name!r}, digest {model.digest})"


def stored_digest(app: AppContext, model: ModelRecord, read: DigestReader | None = None) -> str:
    """The digest of the stored bundle as it is now (every file it covers read once, by `read` where
    given). Raises IntegrityCheckError where a file is missing or unsafe (a symlink), StoreError where
    it cannot be read."""
    path = bundle_path(app, model)
    try:
        if read is None:
            return model_digest(path, bundle_files(model))
        return model_digest(path, bundle_files(model), read=read)
    except ExternalDataError as err:
        raise IntegrityCheckError(f"{_label(model)}: its stored bundle is damaged: {err}") from err
    except _MISSING as err:
        raise IntegrityCheckError(f"{_label(model)}: its stored file {err.filename} is missing") from err
    except OSError as err:
        raise StoreError(f"{_label(model)}: could not read its stored bundle {path.parent}: {err}") from err


def set_model_status(app: AppContext, model_id: int, status: str) -> bool:
    """Set the model's status; returns whether it changed."""
    with app.catalog.write() as session:
        row = session.get(ModelRecord, model_id)
        if row is None or row.status == status:
            return False
        row.status = status
        session.add(row)
    return True


def _mismatch(app: AppContext, model: ModelRecord, read: DigestReader | None = None) -> str | None:
    """Why the stored bundle is not the model's bytes, or None when it hashes to the digest."""
    try:
        got = stored_digest(app, model, read)
    except IntegrityCheckError as err:
        return str(err)
    if got != model.digest:
        where = _bad_chunk(app, model)
        return f"{_label(model)}: its stored bundle {bundle_path(app, model).parent} hashes to {got}{where}"
    return None


def _bad_chunk(app: AppContext, model: ModelRecord) -> str:
    """Where the stored bundle differs, as "; <file>: chunk N (bytes a-b) ...", for the first file
    whose recorded chunk digests (`info["chunk_blake3"]`) a chunk of it does not match; "" where
    none is recorded or every recorded chunk matches."""
    folder = bundle_path(app, model).parent
    for name, encoded in sorted(((model.info or {}).get("chunk_blake3") or {}).items()):
        try:
            check_file_chunks(folder / name, str(encoded), name)
        except IntegrityCheckError as err:
            return f"; {err}"
        except OSError:
            continue  # a missing file: the digest's own message says the bundle is damaged
    return ""


def check_bundle(app: AppContext, model: ModelRecord, read: DigestReader | None = None) -> None:
    """Re-hash the stored bundle (each file by `read` where given); a mismatch or a missing file marks
    the model CORRUPT and raises IntegrityCheckError naming the model, its digest and the repair. A
    match sets a CORRUPT model OK."""
    problem = _mismatch(app, model, read)
    if problem is not None:
        if set_model_status(app, model.id or 0, ModelStatus.CORRUPT):
            details = {"name": model.name, "digest": model.digest, "reason": problem}
            audit.record(app, audit.MODEL_CORRUPT, f"model {model.id}", details)
        logger.warning("model %s is corrupt: %s", model.id, problem)
        raise IntegrityCheckError(
            f"{problem}; the model is CORRUPT (now marked so): re-add the original file "
            "(`enginecache model add FILE`) to repair it"
        )
    if model.status != ModelStatus.OK and set_model_status(app, model.id or 0, ModelStatus.OK):
        details = {"name": model.name, "digest": model.digest, "reason": "its stored bundle hashes to its digest"}
        audit.record(app, audit.MODEL_OK, f"model {model.id}", details)


def ensure_bundle_here(app: AppContext, model: ModelRecord) -> None:
    """Fetch the model's bundle from the remote store where this host lacks it and its files were
    put there at registration (`info["remote_files"]`, `core.bundleremote`): a build host of a fleet
    needs no shared folder. A bundle present here, or one never uploaded, is left to the check."""
    files = (model.info or {}).get("remote_files")
    if files and not model_dir(app.store.home, model.digest).is_dir():
        from enginecache.core.bundleremote import fetch_bundle

        fetch_bundle(app.store, model.digest, files)


def stage_bundle(app: AppContext, model: ModelRecord, folder: Path, *, leases: ExitStack | None = None) -> Path:
    """Put the stored bundle in `folder` (new, private to the caller, who removes it) in the pass that
    hashes it, and return the staged model file: what a converter, a backend or a reference session
    then reads is exactly the bytes that hashed to the digest. A mismatch is `check_bundle`'s (model
    CORRUPT, IntegrityCheckError).

    Without `leases` each file is copied while it is hashed, so whatever happens to the store
    meanwhile cannot reach the reader. With `leases` (the caller's stack, closed once every reader of
    the bundle is done) each file is instead hard-linked into `folder` and hashed where it lies under
    a read lease (core.filelease), kept on `leases`: no multi-GB copy. Closing the stack raises
    IntegrityCheckError, naming the file, where someone opened one for writing (or truncated it)
    while it was held: what was read may then not be what was hashed. A file no lease or link can be
    had for (another owner, another filesystem, a writer holding it open) is copied, as without
    `leases`."""
    ensure_bundle_here(app, model)
    folder.mkdir(parents=True)
    with ExitStack() as held:
        taken: list[tuple[str, ReadLease]] = []

        def stage(file: Path, relpath: str) -> DigestResult:
            dest = folder / relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            lease = _leased_link(file, dest) if leases is not None else None
            if lease is None:
                return copy_hashed(file, dest)
            held.callback(lease.close)
            taken.append((relpath, lease))
            return hash_file(lease.path)

        check_bundle(app, model, stage)
        if leases is not None and taken:
            kept = held.pop_all()  # a bundle that failed its check gives its leases back at once
            leases.push(_lease_check(_label(model), taken, kept))
    return folder / model.filename


def _leased_link(file: Path, dest: Path) -> ReadLease | None:
    """`dest`, a new hard link to the stored `file`, with a read lease taken through it; None (and no
    `dest`) where either cannot be had here (a lease is granted only to the file's owner). The
    stored file then loses its write permission bits (a content-addressed file is never rewritten):
    a reader that tried to write beside its input through the link is refused instead of reaching
    the store."""
    try:
        os.link(file, dest)
    except FileNotFoundError:
        raise
    except OSError:  # EXDEV (another filesystem), EPERM (protected_hardlinks), ...: copy it instead
        return None
    try:
        lease = take_read_lease(str(dest))
    except OSError:
        dest.unlink()
        raise
    if lease is None:
        dest.unlink()
        return None
    try:
        os.chmod(lease.fd, stat.S_IMODE(os.fstat(lease.fd).st_mode) & ~_WRITE_BITS)
    except OSError:
        lease.close()
        dest.unlink()
        raise
    return lease


def _lease_check(label: str, taken: list[tuple[str, ReadLease]], release: ExitStack) -> ExitCallback:
    """The exit callback that releases a staged bundle's leases: it raises IntegrityCheckError where
    one broke while it was held, unless the block is already leaving with an error of its own (which
    stays the error; the broken lease is logged)."""

    def check(exc_type: type[BaseException] | None, *_exc: object) -> bool:
        with release:
            broken = [relpath for relpath, lease in taken if not lease.intact()]
        if broken and exc_type is None:
            raise IntegrityCheckError(
                f"{label}: its stored {', '.join(broken)} was opened for writing while it was being read, so "
                "what was read may not be what was hashed; nothing made from it is kept (build it again)"
            )
        if broken:
            logger.warning("%s: the read lease on %s broke while the build was failing", label, ", ".join(broken))
        return False

    return check


@dataclass(frozen=True)
class ModelVerifyResult:
    model_id: int
    name: str
    digest: str
    ok: bool
    status: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "model",
            "id": self.model_id,
            "name": self.name,
            "digest": self.digest,
            "ok": self.ok,
            "status": self.status,
            "message": self.message,
        }


def verify_models(app: AppContext, models: Sequence[ModelRecord] | None = None) -> list[ModelVerifyResult]:
    """Re-hash each stored model bundle (default: every model, sources and converted variants, by id);
    a mismatch or a missing file marks the model CORRUPT, a match sets it OK."""
    if models is None:
        with app.catalog.read() as session:
            models = list(session.exec(select(ModelRecord).order_by(col(ModelRecord.id))).all())
    results = []
    for model in models:
        try:
            check_bundle(app, model)
        except IntegrityCheckError as err:
            status, ok, message = ModelStatus.CORRUPT, False, str(err)
        else:
            status, ok, message = ModelStatus.OK, True, f"digest {model.digest} matches"
        results.append(ModelVerifyResult(model.id or 0, model.name, model.digest, ok, status, message))
    return results


def restore_bundle(app: AppContext, model: ModelRecord, source: Path) -> bool:
    """For `register_model` of bytes already registered as `model` (`source`, already hashed to its
    digest): keep a stored bundle that still hashes to the digest, else rewrite it from `source` and its
    external data files. Sets the model OK; returns whether anything changed (bytes or status)."""
    problem = _mismatch(app, model)
    if problem is None:
        if model.status == ModelStatus.OK:
            return False
        set_model_status(app, model.id or 0, ModelStatus.OK)
        logger.info("model %s: its stored bundle hashes to its digest again; marked OK", model.id)
        return True
    logger.warning("model %s: repairing its stored bundle from %s (%s)", model.id, source, problem)
    _rewrite_bundle(app, model, source)
    set_model_status(app, model.id or 0, ModelStatus.OK)
    return True


def _rewrite_bundle(app: AppContext, model: ModelRecord, source: Path) -> None:
    """Copy `source` and its external data into a staging folder on the store's filesystem, hash the
    copy (it must be the digest: the source may have changed since it was hashed), then rename each
    file over the stored one (each rename atomic, the bundle folder never absent), fsyncing folders."""
    names = [model.filename, *bundle_files(model)]
    target = model_dir(app.home, model.digest)
    with app.store.temp_dir(prefix="repair-") as staging:
        try:
            for name in names:
                dest = staging / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source if name == model.filename else source.parent / name, dest)
                with open(dest, "rb") as stream:
                    os.fsync(stream.fileno())
        except OSError as err:
            raise StoreError(f"{_label(model)}: could not stage {source} for the repair: {err}") from err
        got = model_digest(staging / model.filename, bundle_files(model))
        if got != model.digest:
            raise IntegrityCheckError(
                f"{_label(model)}: {source} changed while it was copied (the copy hashes to {got}); nothing repaired"
            )
        try:
            target.mkdir(parents=True, exist_ok=True)
            folders = {target}
            for name in names:
                final = target / name
                final.parent.mkdir(parents=True, exist_ok=True)
                os.replace(staging / name, final)
                folders.add(final.parent)
            for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
                fsync_dir(folder)
            fsync_dir(target.parent)
        except OSError as err:
            raise StoreError(f"{_label(model)}: could not rewrite its stored bundle {target}: {err}") from err
    logger.info("model %s: stored bundle rewritten from %s", model.id, source)
