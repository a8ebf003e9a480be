"""What `enginecache gc` decides by and what it reports: its policy (the grace, the temp age, the
pending age, the resume age), each removal (the kind of thing, its path, its size, why, and the error where removing
it failed), what it kept and why, the PENDING engine rows it marks FAILED, and the words for an age
its reasons use."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

DEFAULT_GRACE = timedelta(days=7)
DEFAULT_TEMP_AGE = timedelta(hours=1)
DEFAULT_PENDING_AGE = timedelta(hours=24)
DEFAULT_RESUME_AGE = timedelta(days=1)

UNREFERENCED_BLOB = "unreferenced_blob"
RETIRED_BLOB = "retired_blob"
UNREFERENCED_BUNDLE = "unreferenced_bundle"
TEMP = "temp"
RESUME_STATE = "resume_state"
BACKUP_PARTIAL = "backup_partial"
RESTORE_PARTIAL = "restore_partial"


@dataclass(frozen=True)
class GcPolicy:
    grace: timedelta = DEFAULT_GRACE  # retired engines' blobs, finished jobs' inputs, killed backups' folders
    temp_age: timedelta = DEFAULT_TEMP_AGE  # temp entries, and unreferenced blobs and bundles
    pending_age: timedelta = DEFAULT_PENDING_AGE  # PENDING engine rows with no job
    resume_age: timedelta = DEFAULT_RESUME_AGE  # a killed fetch's resume state (tmp/<sha256>.pull) nobody holds


@dataclass(frozen=True)
class Removal:
    """A file or folder gc removes (or, in a dry run, would remove); `error` when removing it failed."""

    kind: str
    path: str  # relative to the store's home
    size_bytes: int
    reason: str
    engine_ids: tuple[int, ...] = ()
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind, "path": self.path, "bytes": self.size_bytes, "reason": self.reason}
        if self.engine_ids:
            data["engine_ids"] = list(self.engine_ids)
        if self.error is not None:
            data["error"] = self.error
        return data


@dataclass(frozen=True)
class Kept:
    """Something that would be removed but for a live owner or its youth."""

    kind: str
    path: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class AbandonedEngine:
    """A PENDING engine row no build will ever finish."""

    engine_id: int
    job_id: int | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.engine_id, "job_id": self.job_id, "reason": self.reason}


@dataclass
class GcReport:
    applied: bool
    policy: GcPolicy
    removals: list[Removal] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    abandoned: list[AbandonedEngine] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.error is None for r in self.removals)

    @property
    def size_bytes(self) -> int:
        return sum(r.size_bytes for r in self.removals if r.error is None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "grace_days": self.policy.grace / timedelta(days=1),
            "remove": [r.to_dict() for r in self.removals],
            "remove_bytes": self.size_bytes,
            "fail_pending": [a.to_dict() for a in self.abandoned],
            "kept": [k.to_dict() for k in self.kept],
            "errors": [f"{r.path}: {r.error}" for r in self.removals if r.error is not None],
        }


def describe_age(age: timedelta) -> str:
    seconds = age.total_seconds()
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
