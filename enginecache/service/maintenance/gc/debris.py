"""What a killed backup or restore left, as `enginecache gc` of the home finds it
(service.maintenance.workdirs names and holds those folders):

- `backup_partial`: the folder `.<DEST>.partial-<token>` a backup claimed in the store's tmp/
  (`backup-<token>.claim`) and never published, with its claim;
- `restore_partial`: a restore's folder `.<HOME>.restore-*` beside the home, and the SQLite
  catalog `.<catalog>.restore-.<HOME>.restore-*` it staged beside a catalog outside the home.

Each is removed once its writer is gone (nobody holds its lock: a kill -9 releases it) and nothing
in it changed for the grace (`GcPolicy.grace`, `--grace-days`); until then it is listed as kept,
with why. A folder outside the home is shown by its absolute path.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from enginecache.service.maintenance import workdirs
from enginecache.service.maintenance.gc.files import age_of, entries, newest_mtime, tree_size
from enginecache.service.maintenance.gc.report import (
    BACKUP_PARTIAL,
    RESTORE_PARTIAL,
    GcPolicy,
    GcReport,
    Kept,
    Removal,
    describe_age,
)

logger = logging.getLogger(__name__)


def plan_debris(
    home: Path, tmp_dir: Path, catalog_file: Path | None, now: datetime, policy: GcPolicy, report: GcReport
) -> list[Removal]:
    """Backup and restore debris to remove (the held and the young go to `report.kept`);
    `catalog_file` is the SQLite catalog's file (None for PostgreSQL)."""
    planned: list[Removal] = []
    for claim in entries(tmp_dir):
        if workdirs.is_claim_name(claim.name):
            planned.extend(_plan_claim(home, claim, now, policy, report))
    if home.parent != home:
        for path in entries(home.parent):
            if path.name.startswith(workdirs.restore_prefix(home)) and path.is_dir() and not path.is_symlink():
                why = "left by a restore of this home that did not finish"
                planned.extend(_plan(RESTORE_PARTIAL, home, path, path, newest_mtime(path), why, now, policy, report))
    if catalog_file is not None and not catalog_file.is_relative_to(home):
        prefix = workdirs.staged_catalog_prefix(catalog_file, home)
        for path in entries(catalog_file.parent):
            if path.name.startswith(prefix) and path.is_file() and not path.is_symlink():
                folder = _staging_folder(home, path)
                why = f"the catalog a restore staged for {catalog_file.name} and did not finish"
                planned.extend(_plan(RESTORE_PARTIAL, home, path, folder, newest_mtime(path), why, now, policy, report))
    return planned


def _plan_claim(home: Path, claim: Path, now: datetime, policy: GcPolicy, report: GcReport) -> list[Removal]:
    work = workdirs.claimed_folder(claim)
    record = workdirs.read_claim(claim)
    if work is None or not work.is_dir() or work.is_symlink():
        why = "a backup's claim naming no folder it left"
        return _plan(BACKUP_PARTIAL, home, claim, claim, newest_mtime(claim), why, now, policy, report)
    writer = f"pid {record.get('pid')} on {record.get('host')}"
    why = f"left by a backup to {record.get('dest')} ({writer}) that did not finish"
    mtime = max(newest_mtime(work), newest_mtime(claim))
    return _plan(BACKUP_PARTIAL, home, work, claim, mtime, why, now, policy, report)


def _plan(
    kind: str,
    home: Path,
    path: Path,
    lock: Path,
    mtime: float,
    why: str,
    now: datetime,
    policy: GcPolicy,
    report: GcReport,
) -> list[Removal]:
    """`path` (whose writer holds `lock` while it runs) removed, or kept for its writer or its youth."""
    shown = _shown(home, path)
    if workdirs.held(lock):
        writer = "a restore" if kind == RESTORE_PARTIAL else "a backup"
        report.kept.append(Kept(kind, shown, f"{writer} is writing it"))
        return []
    age = age_of(now, mtime)
    if age < policy.grace:
        wait = f"removed once unchanged for {describe_age(policy.grace)}"
        report.kept.append(Kept(kind, shown, f"{why}; changed {describe_age(age)} ago ({wait})"))
        return []
    return [Removal(kind, shown, tree_size(path), f"{why}; unchanged for {describe_age(age)}")]


def remove_debris(home: Path, tmp_dir: Path, removal: Removal) -> Removal:
    """Remove what a `plan_debris` removal names, unless its writer took it up meanwhile; the
    removal, with its `error` where that failed or it was kept."""
    path = home / removal.path
    claim = workdirs.claim_path(tmp_dir, path)
    try:
        if removal.kind == BACKUP_PARTIAL and claim is not None:
            removed = workdirs.remove_unheld(path, lock=claim, claim=claim)
        elif removal.kind == RESTORE_PARTIAL and path.name.startswith(workdirs.restore_prefix(home)):
            removed = workdirs.remove_unheld(path)
        elif removal.kind == RESTORE_PARTIAL:
            removed = workdirs.remove_unheld(path, lock=_staging_folder(home, path))
        else:  # a claim naming no folder
            removed = workdirs.remove_unheld(path)
    except OSError as err:
        logger.warning("gc could not remove %s: %s", path, err)
        return replace(removal, error=str(err))
    return removal if removed else replace(removal, error="its writer took it up meanwhile; kept")


def _staging_folder(home: Path, staged: Path) -> Path:
    """The restore folder whose run staged the catalog file `staged` (its name ends with that folder's)."""
    return home.parent / staged.name[staged.name.rfind(workdirs.restore_prefix(home)) :]


def _shown(home: Path, path: Path) -> str:
    """`path` relative to the home where it is inside it, else absolute."""
    return path.relative_to(home).as_posix() if path.is_relative_to(home) else str(path)
