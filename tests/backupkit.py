"""Helpers of the backup and restore tests (tests/test_backup_*.py, tests/test_restore_*.py): a
backup's manifest read, and written back after a test changed it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def backup_manifest(dest: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((dest / "manifest.json").read_text())
    return manifest


def rewrite_manifest(dest: Path, manifest: dict[str, Any]) -> None:
    """Write `manifest` over the backup's own (a backup a test tampered with)."""
    (dest / "manifest.json").write_text(json.dumps(manifest))
