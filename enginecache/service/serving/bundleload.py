"""A pulled engine bundle answered by `load_or_build("DIR/manifests/MODEL.json")`: its verified folder,
for a runtime that loads a folder itself (TensorRT-LLM's `config.json` + `rank<N>.engine`).

The bundle's manifest blob in DIR is checked against the pull manifest's sha256 and BLAKE3, and the
folder `pull` laid out against that manifest: exactly its files, each one's size, sha256 and BLAKE3
(IntegrityCheckError naming the first that differs). enginecache does not deserialize the rank
engines: `LoadedEngine.session` is a `BundleSession` whose `path` is the folder and `rank_path(n)`
one rank file; its `infer` refuses. Whether this host's runtime can load the folder is its own
check. Signed statements are not checked on this path.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from enginecache.core.backends.base import TensorIO
from enginecache.core.blobpaths import blob_path
from enginecache.core.enginebundle import BundleManifest, folder_matches, parse_manifest
from enginecache.core.hashing import check_file
from enginecache.errors import BadInputError, EngineCacheError, IntegrityCheckError
from enginecache.service.serving.runtimetypes import LoadedEngine


class BundleSession:
    """An engine bundle's verified folder, handed to a runtime that loads folders; it runs nothing."""

    io: tuple[TensorIO, ...] = ()

    def __init__(self, backend: str, path: Path, manifest: BundleManifest) -> None:
        self.backend = backend
        self.path = path
        self.manifest = manifest

    @property
    def raw(self) -> Path:
        return self.path

    def rank_path(self, rank: int) -> Path:
        """The folder's `rank<N>.engine`; BundleError naming the files there are where it has none."""
        return self.path / self.manifest.file(f"rank{rank}.engine").path

    def infer(self, feeds: Any) -> dict[str, Any]:
        raise EngineCacheError(
            f"{self.path} is an engine bundle: load it with a runtime that loads folders (TensorRT-LLM); "
            "enginecache does not run it"
        )

    def close(self) -> None:
        return None


def load_pulled_bundle(manifest_path: Path, data: dict[str, Any]) -> LoadedEngine:
    """The verified folder of the bundle the pull manifest `data` (read from `manifest_path`) names
    (module docstring)."""
    started = time.perf_counter()
    home = manifest_path.parent.parent
    engine = data["engine"]
    label = f"engine {engine['id']}"
    manifest_blob = blob_path(home, engine["sha256"])
    if not manifest_blob.is_file():
        raise IntegrityCheckError(f"{label}: its bundle manifest {manifest_blob} is missing: pull again")
    check_file(manifest_blob, sha256=engine["sha256"], blake3_digest=engine.get("blake3"))
    bundle = parse_manifest(manifest_blob.read_bytes())
    relative = str(data["bundle"]["dir"])
    if relative != f"bundles/{engine['sha256']}":
        raise BadInputError(f"{manifest_path}: names bundle folder {relative!r}, not the one pull lays out")
    folder = home / relative
    if not folder.is_dir():
        raise IntegrityCheckError(f"{label}: its bundle folder {folder} is missing: pull again")
    folder_matches(folder, bundle, label)
    return LoadedEngine(
        BundleSession(str(engine["backend"]), folder, bundle),
        lambda: _no_catalog_row(int(engine["id"])),
        "hit",
        phases={"verify_bundle": time.perf_counter() - started},
        onnx_digest=str(data["model"]["digest"]),
        model_name=str(data["model"]["name"]),
        via="pulled",
    )


def _no_catalog_row(engine_id: int) -> Any:
    raise BadInputError(f"engine {engine_id} is a pulled engine bundle: there is no catalog row here")
