"""What the coverage matrix (`service.fleet.coverage`) and the Hosts view (`service.fleet.hostcoverage`) are
computed from: the catalog's engines in groups alike in what the backend's compatibility rule
decides on, the fleet's newest library version per backend, the distinct known hosts, and the rule
applied once per distinct engine ref and host (`Judge`).

The engine groups are one GROUP BY (at most `GROUPS_MAX` rows) and the fleet's versions one
DISTINCT per backend: Python sees groups, not engines (at 100,000 engines the groups number
thousands, their distinct refs a handful).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import aliased
from sqlmodel import col

from enginecache.core.backends.base import EngineRef
from enginecache.core.backends.registry import all_backends
from enginecache.core.targettext import split_targets
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord, WorkerRecord
from enginecache.service.context import AppContext
from enginecache.service.engines.records import recorded_host, ref_verdict
from enginecache.service.readmodels.hosts import HostRow

GROUPS_MAX = 20_000  # engine groups read (one per model x backend x precision x targets x version x status)


def version_key(version: str) -> tuple[tuple[int, int | str], ...]:
    """A library version comparable part by part ('1.10.0' > '1.9.2'); numbers before words."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|[A-Za-z]+", version))


def not_older(version: str, than: str) -> bool:
    """Whether library `version` is at least `than`, part by part, where a shorter `version` is
    compared on the parts it has: an imported engine's header proves `1.7.1`, the fleet runs
    `1.7.1.116`, and nothing says the engine is older."""
    mine, theirs = version_key(version), version_key(than)
    return mine >= theirs[: len(mine)]


@dataclass(frozen=True)
class EngineGroup:
    """Engines of one source model alike in what the compatibility rule decides on, and status."""

    model_id: int
    backend: str
    precision: str
    targets: tuple[str, ...]
    backend_version: str
    os: str
    status: str
    count: int
    newest_id: int

    def ref(self) -> EngineRef:
        """What the backend's rule knows of the group's engines (no blob here)."""
        return EngineRef(self.backend, self.backend_version, self.targets, self.precision, self.os or None)

    def as_engine(self) -> EngineRecord:
        """The group's newest engine as the rule takes it (only the fields it reads)."""
        return EngineRecord(
            id=self.newest_id,
            model_id=self.model_id,
            backend=self.backend,
            backend_version=self.backend_version,
            precision=self.precision,
            targets=",".join(self.targets),
            os=self.os,
            status=self.status,
            cache_key="",
            onnx_digest="",
        )


@dataclass(frozen=True)
class KnownHost:
    """A distinct host (hostname and library versions): its workers' fingerprint, once."""

    hostname: str
    online: bool
    fingerprint: dict[str, Any] = field(default_factory=dict)


class Judge:
    """The backend's one rule (`service.engines.records.ref_verdict`) for engine groups on a set of hosts:
    each host's recorded fingerprint made a `HostFingerprint` once, each distinct engine ref judged
    once (at 100,000 engines the groups number thousands, their distinct refs a handful)."""

    def __init__(self, fingerprints: Sequence[Mapping[str, Any]]) -> None:
        self._hosts = [recorded_host(f) for f in fingerprints]
        self._seen: dict[EngineRef, list[tuple[str, str]]] = {}

    def __call__(self, ref: EngineRef) -> list[tuple[str, str]]:
        """(verdict, reason) per host, in the order given."""
        if ref not in self._seen:
            self._seen[ref] = [ref_verdict(ref, host) for host in self._hosts]
        return self._seen[ref]


def known_hosts(rows: Sequence[HostRow]) -> list[KnownHost]:
    """One per hostname and set of library versions (as `engine_host_verdicts` counts them)."""
    seen: dict[tuple[str, str], KnownHost] = {}
    for row in rows:
        identity = (row.hostname, str(sorted((row.fingerprint.get("packages") or {}).items())))
        if identity not in seen or (row.online and not seen[identity].online):
            seen[identity] = KnownHost(row.hostname, row.online, dict(row.fingerprint))
    return list(seen.values())


def fleet_versions(app: AppContext) -> dict[str, str]:
    """Per backend, the newest library version any worker in the catalog reports (DISTINCT in SQL)."""
    capabilities = WorkerRecord.__table__.c.capabilities  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    with app.catalog.read() as session:
        for backend in all_backends():
            version = capabilities[("versions", backend.name)].as_string()
            values = session.execute(sa.select(version).where(version.is_not(None)).distinct()).scalars().all()
            versions = [str(v) for v in values if v]
            if versions:
                found[backend.name] = max(versions, key=version_key)
    return found


def engine_groups(
    app: AppContext, *, statuses: Sequence[str] = (EngineStatus.READY, EngineStatus.FAILED, EngineStatus.RETIRED)
) -> list[EngineGroup]:
    """Engines grouped by source model, backend, precision, targets, library version, OS and status
    (GROUP BY in SQL), with their count and newest id."""
    model = aliased(ModelRecord)
    source = sa.func.coalesce(col(model.parent_id), col(EngineRecord.model_id)).label("source")
    keys = (
        source,
        col(EngineRecord.backend),
        col(EngineRecord.precision),
        col(EngineRecord.targets),
        col(EngineRecord.backend_version),
        col(EngineRecord.os),
        col(EngineRecord.status),
    )
    query = (
        sa.select(*keys, sa.func.count(), sa.func.max(col(EngineRecord.id)))
        .join(model, col(model.id) == col(EngineRecord.model_id))
        .where(col(EngineRecord.status).in_(list(statuses)))
        .group_by(*keys)
        .limit(GROUPS_MAX)
    )
    with app.catalog.read() as session:
        rows = session.execute(query).all()
    return [
        EngineGroup(
            model_id=int(r[0]),
            backend=str(r[1]),
            precision=str(r[2]),
            targets=split_targets(str(r[3])),
            backend_version=str(r[4]),
            os=str(r[5] or ""),
            status=str(r[6]),
            count=int(r[7]),
            newest_id=int(r[8]),
        )
        for r in rows
    ]
