"""A backup's manifest (`DEST/manifest.json`): what is in the backup (the catalog kind, its revision
and row counts, each file's digest and size, what was left out and why), written once everything is
copied, and read back (checked to be a manifest this version reads) before a restore."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enginecache.core.distributions import distribution_version
from enginecache.core.hashing import hash_file
from enginecache.errors import BackupRefusedError
from enginecache.service.maintenance.backup.database import POSTGRESQL, SQLITE, CatalogState

MANIFEST = "manifest.json"
FORMAT = "enginecache-backup"
FORMAT_VERSION = 1
CATALOG_FILES = {SQLITE: "catalog.db", POSTGRESQL: "catalog.dump"}


def build_manifest(
    *,
    source: dict[str, str],
    kind: str,
    catalog_file: Path,
    state: CatalogState,
    blobs: list[dict[str, Any]],
    models: list[dict[str, Any]],
    skipped: dict[str, list[dict[str, Any]]],
) -> dict[str, Any]:
    """The manifest of a backup whose catalog copy is `catalog_file` (hashed here) and whose files
    are the `blobs` and `models` entries."""
    catalog_digest = hash_file(catalog_file)
    files = [*blobs, *(f for model in models for f in model["files"])]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "enginecache_version": distribution_version("enginecache") or "unknown",
        "source": source,
        "catalog": {
            "kind": kind,
            "file": catalog_file.name,
            "sha256": catalog_digest.sha256,
            "size": catalog_digest.size,
            "alembic_revision": state.revision,
            "tables": state.tables,
            **state.details,
        },
        "blobs": blobs,
        "models": models,
        "skipped": skipped,
        "totals": {"files": len(files), "bytes": sum(int(f["size"]) for f in files)},
    }


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write `manifest` as `folder`'s new manifest file, fsynced."""
    with open(folder / MANIFEST, "x", encoding="utf-8") as stream:
        json.dump(manifest, stream, indent=2, sort_keys=False)
        stream.write("\n")
        stream.flush()
        os.fsync(stream.fileno())


def read_manifest(src: Path) -> dict[str, Any]:
    """A backup's manifest, checked to be one this version reads."""
    path = src / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise BackupRefusedError(f"{src} is not an enginecache backup: it has no {MANIFEST}") from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BackupRefusedError(f"{path} cannot be read as a backup manifest: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupRefusedError(f"{path} is not an enginecache backup manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise BackupRefusedError(
            f"{path} is backup format {manifest.get('format_version')!r}; this enginecache reads {FORMAT_VERSION}"
        )
    catalog = _require_fields(
        manifest.get("catalog"), ("kind", "file", "sha256", "size", "tables"), f"{path}: the catalog entry"
    )
    if catalog["kind"] not in CATALOG_FILES or catalog["file"] != CATALOG_FILES[catalog["kind"]]:
        raise BackupRefusedError(f"{path}: unknown catalog kind or file {catalog['kind']!r}, {catalog['file']!r}")
    for key in ("blobs", "models"):
        if not isinstance(manifest.get(key), list):
            raise BackupRefusedError(f"{path} is not a complete backup manifest: it has no {key} list")
    for entry in manifest["blobs"]:
        _require_fields(entry, ("path", "sha256", "size"), f"{path}: a blob entry")
    for model in manifest["models"]:
        _require_fields(model, ("digest", "filename", "files"), f"{path}: a model entry")
        for entry in model["files"]:
            _require_fields(entry, ("name", "path", "sha256", "size"), f"{path}: model {model['digest']}'s file entry")
    return manifest


def _require_fields(entry: object, keys: tuple[str, ...], what: str) -> dict[str, Any]:
    """`entry` as a dict that has `keys`; BackupRefusedError naming `what` otherwise."""
    if not isinstance(entry, dict) or any(key not in entry for key in keys):
        raise BackupRefusedError(f"{what} is incomplete: it needs {', '.join(keys)}")
    return entry
