"""Exports: a Triton model repository, or the per-hardware tree operators keep, with a manifest.

- `triton`: `<dest>/<model>/config.pbtxt` and `<dest>/<model>/1/<plan files>`: the engines of the
  backend Triton serves best among those present (its `TritonInfo.rank`), one model file where the
  backend's engine runs on any hardware (ONNX Runtime), else the newest plan per compute capability
  (`Backend.triton_cc_keys`) of engines with the same IO and batching, the lowest compute capability's
  plan the default. The config's rendering and checks are `service.fleet.tritonconfig`. Where a backend's
  engine keeps the model's declared output shapes (`TritonInfo.infer_output_shapes`: ONNX Runtime),
  the output dims come from a shape inference of the graph the engine was built from, not from the
  declaration, which can be wrong (`triton_io`). A backend's `TritonInfo.warning` (TensorRT-RTX:
  stock Triton cannot load its plans) goes into the result's `warnings`, its manifest, and a comment
  at the top of config.pbtxt. Plans are copied into the repository and the copy is re-hashed against
  the catalog's sha256.
- `tree`: `<dest>/<model>/<gpu-or-target>.<precision>.engine` plus `manifest.json` with every
  engine's fingerprint (cache key and its ingredients) and sha256, so a container build can COPY
  the tree and `verify_tree()` it at start. Each engine is one file on disk however many targets
  name it: the store's blob hard-linked (`os.link`) under every name, or, where the store is on
  another filesystem (or hard links are refused), one copy linked under the other names. The bytes
  are hashed once per engine against the catalog. The tree's files share the store's blob: replace
  a file to change it (a new file breaks the link); an in-place write would reach the store, where
  `enginecache verify` reports it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.registry import get_backend
from enginecache.core.blobpaths import blob_path
from enginecache.core.enginebundle import BundleError, BundleFile, BundleManifest, check_entry, folder_matches
from enginecache.core.hashing import hash_file
from enginecache.core.onnx_shapes import infer_output_shapes
from enginecache.core.targettext import split_targets
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord
from enginecache.errors import ExportError, IntegrityCheckError
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import is_bundle, place_bundle, read_manifest
from enginecache.service.fleet.tritonconfig import (
    TRITON_TYPES,
    cc_number,
    render_triton_config,
    render_trtllm_config,
    triton_batching,
    trtllm_max_batch,
    validate_triton_config,
)
from enginecache.service.jobs.refs import engine_targets
from enginecache.service.models.register import model_path
from enginecache.service.models.releases import resolve_model

__all__ = [
    "FORMATS",
    "MANIFEST_NAME",
    "MANIFEST_SCHEMA",
    "TRITON_TYPES",
    "ExportResult",
    "export_model",
    "export_tree",
    "export_triton",
    "render_triton_config",
    "tree_targets",
    "triton_batching",
    "triton_io",
    "validate_triton_config",
    "verify_tree",
]

logger = logging.getLogger(__name__)

FORMATS = ("triton", "tree")
MANIFEST_NAME = "manifest.json"
MANIFEST_SCHEMA = 1


@dataclass(frozen=True)
class ExportResult:
    root: Path
    files: tuple[Path, ...]
    manifest: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "files": [str(p) for p in self.files],
            "manifest": self.manifest,
            "warnings": list(self.warnings),
        }


def _engines(app: AppContext, model: ModelRecord, backend: str | None, precision: str | None) -> list[EngineRecord]:
    query = (
        select(EngineRecord)
        .where(EngineRecord.model_id == model.id, EngineRecord.status == EngineStatus.READY)
        .order_by(col(EngineRecord.id).desc())
    )
    if backend is not None:
        query = query.where(col(EngineRecord.backend) == backend)
    if precision is not None:
        query = query.where(EngineRecord.precision == precision)
    with app.catalog.read() as session:
        return list(session.exec(query).all())


def _copy_verified(app: AppContext, engine: EngineRecord, dest: Path) -> Path:
    source = blob_path(app.home, engine.sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, dest)
    got = hash_file(dest)
    if got.sha256 != engine.sha256:
        dest.unlink(missing_ok=True)
        raise ExportError(
            f"engine {engine.id}: the copy hashes to {got.sha256}, catalog says {engine.sha256} (run verify)"
        )
    return dest


# Where os.link cannot make the tree's file: another filesystem, or one that refuses hard links.
_NO_LINK = frozenset({errno.EXDEV, errno.EPERM, errno.EMLINK, errno.EOPNOTSUPP, errno.ENOTSUP})


def _put(source: Path, dest: Path, *, copy_if_refused: bool) -> str:
    """Make `dest` a hard link of `source` (replacing what is there); where the link is refused and
    `copy_if_refused`, a copy. Returns "link" or "copy"."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    temp = dest.with_name(f".{dest.name}.{os.getpid()}.partial")
    temp.unlink(missing_ok=True)
    how = "link"
    try:
        os.link(source, temp)
    except OSError as err:
        if err.errno not in _NO_LINK or not copy_if_refused:
            raise ExportError(f"could not link {source} to {dest}: {err}") from err
        logger.info("hard link refused (%s): copying %s to %s", err.strerror, source, dest)
        shutil.copyfile(source, temp)
        how = "copy"
    os.replace(temp, dest)
    temp.unlink(missing_ok=True)  # rename(2) leaves both names when they already were one file
    return how


def _place_blob(app: AppContext, engine: EngineRecord, dests: list[Path]) -> str:
    """One file for the engine under every name in `dests`: the store's blob hard-linked, else one
    copy (another filesystem) linked under the other names; hashed once against the catalog.
    Returns "link" or "copy"."""
    source = blob_path(app.home, engine.sha256)
    first, *others = dests
    how = _put(source, first, copy_if_refused=True)
    got = hash_file(first)
    if got.sha256 != engine.sha256:
        first.unlink(missing_ok=True)
        raise ExportError(
            f"engine {engine.id}: its blob hashes to {got.sha256}, catalog says {engine.sha256} (run verify)"
        )
    for dest in others:
        _put(first, dest, copy_if_refused=False)
    return how


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-").lower()


def _model_root(dest: Path, model_name: str) -> Path:
    """`dest/<slug of the name>`, checked after resolving to be a folder strictly under DEST: a
    catalog from before names were constrained may hold `..` or `.`, which would write beside or
    into DEST itself."""
    root = dest / _slug(model_name)
    resolved, base = root.resolve(), dest.resolve()
    if resolved == base or not resolved.is_relative_to(base):
        raise ExportError(f"model name {model_name!r} would write outside {dest}: rename the model first")
    return root


def export_model(
    app: AppContext,
    model: str,
    dest: Path,
    *,
    fmt: str = "tree",
    backend: str | None = None,
    precision: str | None = None,
) -> ExportResult:
    if fmt not in FORMATS:
        raise ExportError(f"unknown export format {fmt!r}: choose {' or '.join(FORMATS)}")
    record, _release = resolve_model(app, model)  # a name, id, digest, or NAME@ALIAS (service.models.releases)
    if fmt == "triton":
        return export_triton(app, record, Path(dest), backend=backend, precision=precision or "fp32")
    return export_tree(app, record, Path(dest), backend=backend, precision=precision)


# -- tree ----------------------------------------------------------------------------------


def tree_targets(engine: EngineRecord) -> list[str]:
    """The hardware names an engine is filed under (the backend's `hardware_names`), as file names:
    each SM (rtx), the GPU and SM (trt), the CPU target (ort)."""
    names = get_backend(engine.backend).hardware_names(engine_targets(engine), engine.target_info)
    return [_slug(name) for name in names]


def export_tree(
    app: AppContext, model: ModelRecord, dest: Path, *, backend: str | None = None, precision: str | None = None
) -> ExportResult:
    engines = _engines(app, model, backend, precision)
    if not engines:
        raise ExportError(f"model {model.name} has no READY engine to export" + _filter_text(backend, precision))
    root = _model_root(dest, model.name)
    root.mkdir(parents=True, exist_ok=True)
    entries: list[dict[str, Any]] = []
    files: list[Path] = []
    taken: set[str] = set()
    for engine in engines:  # newest first: a newer engine for the same hardware and precision wins
        names: dict[str, str] = {}  # file name -> target
        bundle = is_bundle(engine)  # an engine bundle is a folder, `<target>.<precision>.bundle`
        for target in tree_targets(engine):
            name = f"{target}.{engine.precision}.{'bundle' if bundle else 'engine'}"
            if name not in taken:
                taken.add(name)
                names[name] = target
        if not names:
            continue
        if bundle:
            listed = _place_bundle_folders(app, engine, [root / name for name in names])
            files.extend(root / name / f["path"] for name in names for f in listed)
        else:
            _place_blob(app, engine, [root / name for name in names])
            files.extend(root / name for name in names)
        for name, target in names.items():
            entries.append(
                {
                    **({"bundle": {"files": listed}} if bundle else {}),
                    "file": name,
                    "engine_id": engine.id,
                    "backend": engine.backend,
                    "backend_version": engine.backend_version,
                    "precision": engine.precision,
                    "target": target,
                    "targets": list(split_targets(engine.targets)),
                    "sha256": engine.sha256,
                    "blake3": engine.blake3,
                    "size_bytes": engine.size_bytes,
                    "fingerprint": {
                        "cache_key": engine.cache_key,
                        "key_ingredients": engine.key_ingredients,
                        "build_host": {k: engine.host.get(k) for k in ("hostname", "os", "machine", "cpu_model")},
                    },
                    "io": engine.io,
                    "profiles": engine.build_options.get("profiles", {}),
                    "created_at": engine.created_at.isoformat(),
                }
            )
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "model": model.name,
        "model_digest": model.digest,
        "engines": sorted(entries, key=lambda e: e["file"]),
    }
    manifest_path = root / MANIFEST_NAME
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str) + "\n")
    return ExportResult(root, (*sorted(files), manifest_path), manifest)


def _place_bundle_folders(app: AppContext, engine: EngineRecord, dests: list[Path]) -> list[dict[str, Any]]:
    """Bundle `engine` laid out as each folder in `dests` (`service.engines.bundles.place_bundle`:
    every file hard-linked or copied and hashed against its manifest, the folder renamed into place;
    one there already is replaced). The manifest's files, as its JSON lists them."""
    for dest in dests:
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)
        else:
            dest.unlink(missing_ok=True)
        place_bundle(app, engine, dest)
    return [f.to_dict() for f in read_manifest(app, engine).files]


def _bundle_problems(folder: Path, entry: dict[str, Any]) -> list[str]:
    try:
        listed = tuple(BundleFile(**f) for f in entry["bundle"]["files"])
        folder_matches(folder, BundleManifest(listed), entry["file"])
    except (IntegrityCheckError, BundleError) as err:
        return [str(err)]
    return []


def verify_tree(model_dir: Path) -> list[str]:
    """Re-hash every engine a tree's manifest lists (each file of an engine bundle's folder); returns
    the problems (empty: all verified)."""
    manifest = json.loads((Path(model_dir) / MANIFEST_NAME).read_text())
    problems = []
    digests: dict[tuple[int, int], str] = {}  # (device, inode) -> sha256: hard links are hashed once
    for entry in manifest["engines"]:
        path = Path(model_dir) / entry["file"]
        if entry.get("bundle"):
            problems.extend(_bundle_problems(path, entry) if path.is_dir() else [f"{entry['file']}: missing"])
            continue
        if not path.is_file():
            problems.append(f"{entry['file']}: missing")
            continue
        stat = path.stat()
        inode = (stat.st_dev, stat.st_ino)
        got = digests.get(inode) or digests.setdefault(inode, hash_file(path).sha256)
        if got != entry["sha256"]:
            problems.append(f"{entry['file']}: sha256 {got} does not match the manifest's {entry['sha256']}")
    return problems


# -- triton --------------------------------------------------------------------------------


def _merge_shape(recorded: list[Any], inferred: tuple[int | str, ...]) -> list[Any]:
    """The inferred shape, keeping a recorded dim only where inference left that dim unknown."""
    if len(recorded) != len(inferred):
        return list(inferred)
    return [old if new == "?" else new for old, new in zip(recorded, inferred, strict=True)]


def triton_io(app: AppContext, engine: EngineRecord) -> list[dict[str, Any]]:
    """The IO an export writes: the engine's, with output shapes from a shape inference of the graph
    it was built from where its backend keeps the model's declared output shapes (ONNX Runtime)."""
    if not get_backend(engine.backend).triton.infer_output_shapes:
        return list(engine.io)
    with app.catalog.read() as session:
        source = session.get(ModelRecord, engine.variant_model_id or engine.model_id)
    if source is None:
        return list(engine.io)
    inferred = infer_output_shapes(model_path(app, source))
    io = []
    for tensor in engine.io:
        if tensor["mode"] == "output" and tensor["name"] in inferred:
            shape = _merge_shape(list(tensor["shape"]), inferred[tensor["name"]])
            if shape != list(tensor["shape"]):
                logger.info(
                    "output %s: shape %s as the graph computes it (recorded %s)", tensor["name"], shape, tensor["shape"]
                )
            tensor = {**tensor, "shape": shape}
        io.append(tensor)
    return io


def _io_signature(engine: EngineRecord) -> list[tuple[str, str, str]]:
    return [(t["name"], t["mode"], t["dtype"]) for t in engine.io]


def export_triton(
    app: AppContext, model: ModelRecord, dest: Path, *, backend: str | None = None, precision: str = "fp32"
) -> ExportResult:
    engines = _engines(app, model, backend, precision)
    bundles = [engine for engine in engines if is_bundle(engine)]
    engines = [engine for engine in engines if not is_bundle(engine)]
    if not engines and bundles:
        return _export_triton_bundle(app, model, dest, bundles)
    if not engines:
        raise ExportError(f"model {model.name} has no READY engine to export" + _filter_text(backend, precision))
    by_backend: dict[str, list[EngineRecord]] = {}
    for engine in engines:
        by_backend.setdefault(engine.backend, []).append(engine)
    # With no backend named, the one Triton serves best (its rank) among those present.
    chosen = min((get_backend(b) for b in by_backend), key=lambda b: b.triton.rank)
    engines = by_backend[chosen.name]
    base = engines[0]
    root = _model_root(dest, model.name)
    name = root.name
    version_dir = root / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    suffix = chosen.triton.file_suffix
    io = triton_io(app, base)
    if not chosen.triton_cc_keys(engine_targets(base)):  # one model file whatever the hardware
        default_file = f"model{suffix}"
        files.append(_copy_verified(app, base, version_dir / default_file))
        text = render_triton_config(name, base, default_file=default_file, io=io)
    else:
        cc_files: dict[str, str] = {}
        for engine in engines:  # newest first: the newest plan for each compute capability wins
            if _io_signature(engine) != _io_signature(base) or triton_batching(engine) != triton_batching(base):
                logger.info("engine %s skipped: its IO or batching differs from engine %s", engine.id, base.id)
                continue
            targets = engine_targets(engine)
            free = [key for key in chosen.triton_cc_keys(targets) if key not in cc_files]
            if not free:
                continue
            filename = f"model.{'_'.join(targets)}{suffix}"
            files.append(_copy_verified(app, engine, version_dir / filename))
            for key in free:
                cc_files[key] = filename
        default_file = cc_files[min(cc_files, key=cc_number)]  # the lowest compute capability
        text = render_triton_config(name, base, default_file=default_file, cc_files=cc_files, io=io)
    config_path = root / "config.pbtxt"
    config_path.write_text(text)
    parsed = validate_triton_config(text, version_dir)
    warnings = (chosen.triton.warning,) if chosen.triton.warning else ()
    for warning in warnings:
        logger.warning("export of %s: %s", model.name, warning)
    manifest = {"config": parsed or text, "warnings": list(warnings)}
    return ExportResult(root, (config_path, *sorted(files)), manifest, warnings)


def _export_triton_bundle(app: AppContext, model: ModelRecord, dest: Path, bundles: list[EngineRecord]) -> ExportResult:
    """The newest READY bundle in Triton's TensorRT-LLM layout: `<model>/1/` holds the verified engine
    folder (`place_bundle`), config.pbtxt names it for the `tensorrtllm` backend. That backend loads one
    folder per model, so bundles built for different GPUs are refused here (the tree layout keeps one
    folder per GPU)."""
    by_targets = {tuple(engine_targets(engine)): engine for engine in reversed(bundles)}  # newest wins
    if len(by_targets) > 1:
        listed = ", ".join(f"engine {e.id} ({','.join(t)})" for t, e in sorted(by_targets.items()))
        raise ExportError(
            f"model {model.name}'s engine bundles are built for different GPUs ({listed}); Triton's tensorrtllm "
            "backend loads one engine folder per model: export --format tree writes one folder per GPU"
        )
    (engine,) = by_targets.values()
    config = json.loads(_bundle_file_bytes(app, engine, "config.json"))
    max_batch = trtllm_max_batch(config, f"engine {engine.id}")
    root = _model_root(dest, model.name)
    version_dir = (root / "1").resolve()
    if version_dir.exists():
        shutil.rmtree(version_dir)  # an earlier export of this model: replaced as a whole
    place_bundle(app, engine, version_dir)
    warning = get_backend(engine.backend).triton.warning
    text = render_trtllm_config(root.name, engine_dir=version_dir, max_batch=max_batch, warning=warning)
    config_path = root / "config.pbtxt"
    config_path.write_text(text)
    parsed = validate_triton_config(text, version_dir)
    warnings = (warning,) if warning else ()
    for line in warnings:
        logger.warning("export of %s: %s", model.name, line)
    files = sorted(path for path in version_dir.rglob("*") if path.is_file())
    manifest = {"config": parsed or text, "warnings": list(warnings), "engine": engine.id, "bundle": True}
    return ExportResult(root, (config_path, *files), manifest, warnings)


def _bundle_file_bytes(app: AppContext, engine: EngineRecord, path: str) -> bytes:
    """One file of bundle `engine`, read from its blob and checked against the manifest."""
    entry = read_manifest(app, engine).file(path)
    blob = blob_path(app.home, entry.sha256)
    check_entry(blob, entry, f"engine {engine.id}")
    return blob.read_bytes()


def _filter_text(backend: str | None, precision: str | None) -> str:
    parts = [p for p in (backend, precision) if p]
    return f" ({' '.join(parts)})" if parts else ""
