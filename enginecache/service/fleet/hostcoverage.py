"""What each known host can load of the READY engines, and what it lacks (the Hosts view): the
engine groups of `service.fleet.coverage` judged once per host by the backend's one rule
(`service.engines.records.ref_verdict` through `coverage.Judge`, on the host's recorded fingerprint)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from enginecache.core.verdicts import Verdict
from enginecache.db.models import EngineStatus, ModelRecord
from enginecache.service.context import AppContext
from enginecache.service.fleet.coverage import EngineGroup, Judge, engine_groups
from enginecache.service.readmodels.hosts import HostRow


@dataclass(frozen=True)
class HostEngine:
    model: str
    backend: str
    precision: str
    targets: str
    backend_version: str
    engine_id: int  # the newest of the group
    count: int
    verdict: str
    reason: str


@dataclass(frozen=True)
class HostCoverage:
    loadable: list[HostEngine]  # READY engine groups this host can load
    lacking: list[HostEngine]  # per model x backend x precision READY somewhere: none this host can load (the newest)


def host_coverage(app: AppContext, fingerprint: dict[str, Any]) -> HostCoverage:
    """What a host (its recorded fingerprint) can load of the READY engines, and which model x
    backend x precision that has READY engines it cannot load any of (with the rule's reason)."""
    return _host_coverage(*_ready_groups(app), fingerprint)


def hosts_coverage(app: AppContext, hosts: Sequence[HostRow]) -> dict[str, HostCoverage]:
    """`host_coverage` of each worker, by name, from one read of the READY engine groups."""
    groups, names = _ready_groups(app)
    return {h.name: _host_coverage(groups, names, h.fingerprint) for h in hosts}


def _ready_groups(app: AppContext) -> tuple[list[EngineGroup], dict[int, str]]:
    groups = engine_groups(app, statuses=(EngineStatus.READY,))
    with app.catalog.read() as session:
        names = {
            int(i): str(n) for i, n in session.execute(sa.select(col(ModelRecord.id), col(ModelRecord.name))).all()
        }
    return groups, names


def _host_coverage(groups: Sequence[EngineGroup], names: dict[int, str], fingerprint: dict[str, Any]) -> HostCoverage:
    loadable: list[HostEngine] = []
    refused: dict[tuple[int, str, str], HostEngine] = {}
    covered: set[tuple[int, str, str]] = set()
    judge = Judge([fingerprint])
    for group in sorted(groups, key=lambda g: -g.newest_id):
        [(verdict, reason)] = judge(group.ref())
        row = HostEngine(
            names.get(group.model_id, f"model {group.model_id}"),
            group.backend,
            group.precision,
            ",".join(group.targets),
            group.backend_version,
            group.newest_id,
            group.count,
            verdict,
            reason,
        )
        what = (group.model_id, group.backend, group.precision)
        if verdict == Verdict.COMPATIBLE:
            loadable.append(row)
            covered.add(what)
        else:
            refused.setdefault(what, row)
    lacking = [row for what, row in refused.items() if what not in covered]
    order = lambda r: (r.model, r.backend, r.precision, r.targets)  # noqa: E731
    return HostCoverage(sorted(loadable, key=order), sorted(lacking, key=order))
