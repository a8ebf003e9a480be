"""The store's files as `enginecache gc` sees them: the blobs under `objects/`, the entries of a
folder, a tree's size and newest change (symlinks not followed, entries gone meanwhile skipped), and
removing an entry (one gone meanwhile is no error; any other failure is the removal's `error`; a
resume state only while no fetch holds it, core.rangedfetch.remove_unheld)."""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Iterable, Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from enginecache.core import rangedfetch
from enginecache.core.blobpaths import is_digest
from enginecache.service.maintenance.gc.report import RESUME_STATE, Removal

logger = logging.getLogger(__name__)


def blob_files(objects_dir: Path) -> Iterator[Path]:
    """The blobs under objects/sha256/<2>/ (names the store writes; anything else is left alone)."""
    for shard in entries(objects_dir):
        if len(shard.name) != 2 or not shard.is_dir() or shard.is_symlink():
            continue
        for path in entries(shard):
            if is_digest(path.name) and path.name[:2] == shard.name and not path.is_dir():
                yield path


def entries(folder: Path) -> list[Path]:
    """The entries of `folder`, sorted; none where it does not exist."""
    try:
        return sorted(Path(entry.path) for entry in os.scandir(folder))
    except FileNotFoundError:
        return []


def _walk(path: Path) -> Iterable[os.stat_result]:
    """lstat of `path` and of everything below it (symlinks not followed); gone entries skipped."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    yield info
    if stat.S_ISDIR(info.st_mode):
        for child in entries(path):
            yield from _walk(child)


def newest_mtime(path: Path) -> float:
    return max((info.st_mtime for info in _walk(path)), default=0.0)


def tree_size(path: Path) -> int:
    return sum(info.st_size for info in _walk(path) if not stat.S_ISDIR(info.st_mode))


def age_of(now: datetime, mtime: float) -> timedelta:
    return timedelta(seconds=now.timestamp() - mtime)


def remove(home: Path, removal: Removal) -> Removal:
    """Remove what `removal` names under `home`; the removal, with its `error` where that failed."""
    path = home / removal.path
    try:
        if removal.kind == RESUME_STATE:
            if not rangedfetch.remove_unheld(path):  # a fetch took it up since the plan: it stays
                return replace(removal, error="a fetch took it up meanwhile; kept")
        elif path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, onerror=_unless_gone)
        else:
            path.unlink(missing_ok=True)  # gone meanwhile (another gc, a finishing build): the outcome holds
    except OSError as err:
        logger.warning("gc could not remove %s: %s", path, err)
        return Removal(removal.kind, removal.path, removal.size_bytes, removal.reason, removal.engine_ids, str(err))
    return removal


def _unless_gone(_function: Any, _path: str, exc_info: Any) -> None:
    """rmtree's error handler: an entry removed meanwhile is no error; anything else is raised."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
