"""A model bundle's files in the remote store, so a build host that never saw `model add` can build.

Each file of a bundle (the model file and its external data files) is a content-addressed blob in
the remote, under its own sha256 (the key every blob has, `core.objectstore.blob_key`): `upload_bundle`
puts them (a conditional put: nothing is overwritten) and returns what the catalog keeps in the
model's `info["remote_files"]`, `{relative name: [sha256, size]}`. `fetch_bundle` downloads them into
`models/<digest>/` on a host that lacks the folder: each file is written to a staging folder while
hashed and refused unless it is those bytes, and the folder takes its name only once every file is
there, so no half bundle is ever seen. The bundle's own digest is checked again by whoever reads it
(`service.models.verify.stage_bundle` hashes the copy it builds from).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from enginecache.core.hashing import DigestResult, hash_file
from enginecache.core.store import ArtifactStore, HashingWriter
from enginecache.errors import IntegrityCheckError, StoreError

logger = logging.getLogger(__name__)

RemoteFiles = dict[str, list[str | int]]  # relative name -> [sha256, size]


def upload_bundle(
    store: ArtifactStore, digest: str, names: Sequence[str], *, known: Mapping[str, DigestResult] | None = None
) -> RemoteFiles | None:
    """Put each stored file of bundle `digest` into the remote; what to keep in the model's info.
    None where the store has no remote (nothing to do). `known`: digests of stored files taken as
    they were copied in (`ArtifactStore.put_model_bundle(digests=...)`); the others are hashed here."""
    remote = store.remote
    if remote is None:
        return None
    folder = store.model_dir(digest)
    files: RemoteFiles = {}
    for name in names:
        path = folder / name
        found = (known or {}).get(name) or hash_file(path)
        remote.put_blob(found.sha256, path, found.size)
        files[name] = [found.sha256, found.size]
    logger.info("model bundle %s: %d file(s) in %s", digest[:12], len(files), remote.describe())
    return files


def fetch_bundle(store: ArtifactStore, digest: str, files: Mapping[str, Sequence[str | int]]) -> Path:
    """Make bundle `digest` present here from the remote (module docstring); its folder.

    IntegrityCheckError: a remote file is not the bytes recorded for it (nothing is left here);
    StoreError: no remote is set, or it cannot be read."""
    target = store.model_dir(digest)
    if target.is_dir():
        return target
    remote = store.remote
    if remote is None:
        raise StoreError(f"model bundle {digest} is not stored here ({target}) and no remote store is set")
    with store.temp_dir(prefix="model-fetch-") as staging:
        for name, (sha256, size) in files.items():
            dest = staging / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(dest, "wb") as stream:
                writer = HashingWriter(stream)
                remote.read_blob(str(sha256), writer.write, size=int(size))
                stream.flush()
                os.fsync(stream.fileno())
            got = writer.hasher.result()
            if got.sha256 != sha256:
                raise IntegrityCheckError(
                    f"model bundle {digest}: the remote's {name} hashes to {got.sha256}, not {sha256}: refused"
                )
        try:
            store.adopt_bundle(staging, digest)
        except OSError as err:
            raise StoreError(f"could not store fetched model bundle {digest} at {target}: {err}") from err
    logger.info("fetched model bundle %s (%d file(s)) from %s", digest[:12], len(files), remote.describe())
    return target
