"""Coverage: which engines the fleet has, per model x GPU (or CPU) target x precision, and what each
known host can load of them (per host: `service.fleet.hostcoverage`).

A cell is one source model (engines built from its converted variants count under it), one
backend target (a compute capability TensorRT-RTX builds for from anywhere, or a GPU or CPU target
of a worker the catalog has seen) and one precision. Its state, from the catalog as it is now:

- READY: a READY engine covers the target, built with the newest library version the fleet runs,
  and at least one known host can load it;
- BUILT: such an engine exists, no known host can load it, and no known host has this column's
  target ("built, no host of this class seen yet": a TensorRT-RTX engine built ahead of time on a
  CPU host for a GPU the fleet has not shown yet, which nothing has tried to load);
- INCOMPATIBLE: such an engine exists and hosts of its class are known, but every known host refuses
  it ("incompatible with every host seen": the backend's one rule,
  `service.engines.records.ref_verdict`, decided on each worker's recorded fingerprint);
- STALE: the READY engines that cover it were all built with an older library version than the
  fleet's newest (the newest `capabilities.versions[backend]` the workers table holds);
- BUILDING: no current READY engine, and a build job for it is QUEUED or RUNNING;
- UNPROVEN: nothing READY and no build running, but an imported engine covers it that no host has
  loaded yet (`engine import`; lookups pass it by until a test-load proves it);
- FAILED: nothing READY, and the newest engine built for it FAILED (its error is the reason);
- MISSING: nothing at all, or only RETIRED engines.

A cell that names an engine says where that engine came from when it was not built here
(`READY · engine 7 · imported`, `UNPROVEN · engine 9 · imported bundle`): its `provenance` is
`service.engines.provenance.provenance_kind`, the one owner of those labels (`profiles` says the same).

The engine groups, the fleet's versions and the active builds are read with three SQL statements
(GROUP BY, DISTINCT, and a bounded scan of active jobs); the verdicts are the backend's rule applied
once per engine group and host. The groups, the fleet's versions, the known hosts and the rule's
`Judge` are `service.engines.groups` (shared with the Hosts view); this module builds the matrix:
its columns, and each cell's state and reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import sqlalchemy as sa
from sqlmodel import col

from enginecache.core.backends.registry import all_backends, backend_label
from enginecache.core.verdicts import Verdict
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, ModelRecord
from enginecache.service.context import AppContext
from enginecache.service.engines.groups import EngineGroup as EngineGroup  # re-exported
from enginecache.service.engines.groups import Judge as Judge  # re-exported
from enginecache.service.engines.groups import KnownHost as KnownHost  # re-exported
from enginecache.service.engines.groups import engine_groups as engine_groups  # re-exported
from enginecache.service.engines.groups import fleet_versions as fleet_versions  # re-exported
from enginecache.service.engines.groups import known_hosts as known_hosts  # re-exported
from enginecache.service.engines.groups import not_older
from enginecache.service.engines.groups import version_key as version_key  # re-exported
from enginecache.service.engines.provenance import BUILT_HERE, provenance_kind
from enginecache.service.readmodels.hosts import HostRow, worker_hosts
from enginecache.service.readmodels.jobs import ACTIVE_JOB_STATUSES

READY = "READY"
BUILT = "BUILT"
INCOMPATIBLE = Verdict.INCOMPATIBLE.outcome
STALE = "STALE"
BUILDING = "BUILDING"
FAILED = "FAILED"
MISSING = "MISSING"
UNPROVEN = EngineStatus.UNPROVEN.value
MARK_SEPARATOR = " · "  # before a cell's provenance mark: `READY · engine 7 · imported`
STATES: tuple[str, ...] = (READY, BUILT, INCOMPATIBLE, STALE, BUILDING, FAILED, MISSING, UNPROVEN)
# What BUILT and INCOMPATIBLE mean, as a cell's reason, the legend and the docs say it.
NO_HOST_OF_CLASS = "built, no host of this class seen yet"
REFUSED_BY_EVERY_HOST = "incompatible with every host seen"
BUILDABLE: tuple[str, ...] = (MISSING, STALE)  # what "build the missing and stale cells" submits
ACTIVE_BUILDS_SCANNED = 1000  # active build jobs looked at (the queue's head, oldest first)


@dataclass(frozen=True)
class Column:
    """One backend target: `hosts` are the known workers' hostnames that have it."""

    backend: str
    target: str
    hosts: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        count = len(self.hosts)
        where = f"{count} host{'s' if count != 1 else ''}" if count else "no host"
        return f"{backend_label(self.backend)} {self.target} ({where})"


@dataclass(frozen=True)
class Cell:
    model_id: int
    precision: str
    column: Column
    state: str
    text: str  # "READY · engine 12": the state's name first (never colour alone)
    engine_id: int | None = None
    job_id: int | None = None
    reason: str = ""  # why: the hosts it loads on, the rule's refusal, the build error, the versions
    provenance: str = ""  # the engine's `provenance_kind` (built here, imported, imported bundle); "": no engine


@dataclass(frozen=True)
class Coverage:
    models: list[tuple[int, str]]  # (id, name) of the source models shown, by name
    precisions: tuple[str, ...]
    columns: list[Column]
    cells: list[Cell]
    fleet_versions: dict[str, str]  # backend -> the newest version a worker reports
    host_count: int

    def cell(self, model_id: int, precision: str, column: Column) -> Cell | None:
        return self._index.get((model_id, precision, column.backend, column.target))

    @cached_property
    def _index(self) -> dict[tuple[int, str, str, str], Cell]:
        return {(c.model_id, c.precision, c.column.backend, c.column.target): c for c in self.cells}

    def counts(self) -> dict[str, int]:
        """How many cells are in each state (every state named, zeros included)."""
        found = {state: 0 for state in STATES}
        for c in self.cells:
            found[c.state] += 1
        return found


def _errors(app: AppContext, engine_ids: Iterable[int]) -> dict[int, str]:
    ids = sorted(set(engine_ids))
    if not ids:
        return {}
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(col(EngineRecord.id), col(EngineRecord.error)).where(col(EngineRecord.id).in_(ids))
        ).all()
    return {int(i): str(e or "no reason recorded") for i, e in rows}


def _provenances(app: AppContext, engine_ids: Iterable[int]) -> dict[int, str]:
    """engine id -> its `provenance_kind`, for the engines the cells name (one SELECT)."""
    ids = sorted(set(engine_ids))
    if not ids:
        return {}
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(col(EngineRecord.id), col(EngineRecord.provenance)).where(col(EngineRecord.id).in_(ids))
        ).all()
    return {int(i): provenance_kind(p) for i, p in rows}


def _marked(cell: Cell, kinds: dict[int, str]) -> Cell:
    """`cell` with its engine's provenance, named in its text where the engine was not built here."""
    if cell.engine_id is None or cell.engine_id not in kinds:
        return cell
    kind = kinds[cell.engine_id]
    text = cell.text if kind == BUILT_HERE else f"{cell.text}{MARK_SEPARATOR}{kind}"
    return replace(cell, provenance=kind, text=text)


def _active_builds(app: AppContext, parents: dict[int, int]) -> dict[tuple[int, str, str, str], int]:
    """(source model, backend, target, precision) -> the oldest QUEUED/RUNNING build job for it."""
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(col(JobRecord.id), col(JobRecord.payload))
            .where(col(JobRecord.kind) == "build", col(JobRecord.status).in_(ACTIVE_JOB_STATUSES))
            .order_by(col(JobRecord.id))
            .limit(ACTIVE_BUILDS_SCANNED)
        ).all()
    found: dict[tuple[int, str, str, str], int] = {}
    for job_id, payload in rows:
        model = str((payload or {}).get("model") or "")
        if not model.isdigit():
            continue
        source = parents.get(int(model), int(model))
        for target in payload.get("targets") or []:
            found.setdefault((source, str(payload.get("backend")), str(target), str(payload.get("precision"))), job_id)
    return found


def _models(app: AppContext, model_ids: Sequence[int] | None) -> tuple[list[tuple[int, str]], dict[int, int]]:
    """The source models to show, by name, and every variant's source."""
    with app.catalog.read() as session:
        rows = session.execute(sa.select(col(ModelRecord.id), col(ModelRecord.name), col(ModelRecord.parent_id))).all()
    parents = {int(i): int(p) for i, _, p in rows if p is not None}
    wanted = None if model_ids is None else set(model_ids)
    sources = sorted(
        ((int(i), str(n)) for i, n, p in rows if p is None and (wanted is None or int(i) in wanted)),
        key=lambda m: (m[1], m[0]),
    )
    return sources, parents


def columns_for(
    hosts: Sequence[HostRow],
    groups: Sequence[EngineGroup],
    backends: Sequence[str] | None,
    *,
    building: Iterable[tuple[str, str]] = (),
    every_target: bool = False,
) -> list[Column]:
    """Per backend, in the registry's order: the GPU or CPU targets of the known workers that have
    it, any target an engine in the catalog was built for, and any an active build job (`building`:
    (backend, target)) is for; with `every_target`, also every target it builds for from anywhere
    (TensorRT-RTX's compute capabilities). Each column names the hosts that have it."""
    columns: list[Column] = []
    busy = set(building)
    built_for: dict[str, set[str]] = {}  # backend -> the targets its engines in the catalog were built for
    for group in groups:
        built_for.setdefault(group.backend, set()).update(group.targets)
    for backend in all_backends():
        if backends is not None and backend.name not in backends:
            continue
        where: dict[str, set[str]] = {t: set() for t in backend.known_targets()} if every_target else {}
        where.update({t: set() for b, t in sorted(busy) if b == backend.name})
        for host in hosts:
            caps = host.capabilities
            if backend.name not in caps.get("backends", []):
                continue
            if backend.device == "gpu":
                for gpu in caps.get("gpus") or []:
                    where.setdefault(str(gpu.get("compute_capability")), set()).add(host.hostname)
            elif caps.get("cpu_target"):
                where.setdefault(str(caps["cpu_target"]), set()).add(host.hostname)
        for target in built_for.get(backend.name, ()):
            where.setdefault(target, set())
        known = [t for t in backend.known_targets() if t in where]
        ordered = known + sorted(t for t in where if t not in known)
        columns += [Column(backend.name, t, tuple(sorted(where[t]))) for t in ordered]
    return columns


def coverage(
    app: AppContext,
    *,
    model_ids: Sequence[int] | None = None,
    backends: Sequence[str] | None = None,
    precisions: Sequence[str] = ("fp32", "fp16"),
    every_target: bool = False,
) -> Coverage:
    """The matrix for these models (None: every source model), backends (None: all) and precisions,
    over the targets in use (a known host has it, an engine or an active build is for it), or with
    `every_target` over every target each backend builds for too."""
    models, parents = _models(app, model_ids)
    host_rows = worker_hosts(app)
    hosts = known_hosts(host_rows)
    groups = engine_groups(
        app, statuses=(EngineStatus.READY, EngineStatus.UNPROVEN, EngineStatus.FAILED, EngineStatus.RETIRED)
    )
    fleet = fleet_versions(app)
    active = _active_builds(app, parents)
    columns = columns_for(
        host_rows, groups, backends, building=[(b, t) for _, b, t, _ in active], every_target=every_target
    )
    shown = {m for m, _ in models}
    by_cell: dict[tuple[int, str, str, str], list[EngineGroup]] = {}
    for group in groups:
        if group.model_id in shown and group.precision in precisions:
            for target in group.targets:
                by_cell.setdefault((group.model_id, group.backend, target, group.precision), []).append(group)
    failed_ids = [g.newest_id for g in groups if g.status == EngineStatus.FAILED and g.model_id in shown]
    errors = _errors(app, failed_ids)
    verdicts: dict[EngineGroup, list[tuple[str, str]]] = {}
    judge = Judge([h.fingerprint for h in hosts])
    cells = []
    for model_id, _ in models:
        for precision in precisions:
            for column in columns:
                key = (model_id, column.backend, column.target, precision)
                cells.append(
                    _cell(
                        model_id,
                        precision,
                        column,
                        by_cell.get(key, []),
                        fleet,
                        hosts,
                        verdicts,
                        judge,
                        active.get(key),
                        errors,
                    )
                )
    kinds = _provenances(app, (c.engine_id for c in cells if c.engine_id is not None))
    cells = [_marked(c, kinds) for c in cells]
    return Coverage(models, tuple(precisions), columns, cells, fleet, len(hosts))


def _cell(
    model_id: int,
    precision: str,
    column: Column,
    groups: list[EngineGroup],
    fleet: dict[str, str],
    hosts: list[KnownHost],
    verdicts: dict[EngineGroup, list[tuple[str, str]]],
    judge: Judge,
    job_id: int | None,
    errors: dict[int, str],
) -> Cell:
    def make(state: str, text: str, engine_id: int | None = None, reason: str = "") -> Cell:
        return Cell(model_id, precision, column, state, text, engine_id, job_id, reason)

    newest_version = fleet.get(column.backend)
    ready = sorted((g for g in groups if g.status == EngineStatus.READY), key=lambda g: -g.newest_id)
    current = [g for g in ready if newest_version is None or not_older(g.backend_version, newest_version)]
    for group in current:
        if group not in verdicts:
            verdicts[group] = judge(group.ref())
    loadable = [g for g in current if any(v == Verdict.COMPATIBLE for v, _ in verdicts[g])]
    if loadable:
        best = loadable[0]
        count = sum(v == Verdict.COMPATIBLE for v, _ in verdicts[best])
        return make(
            READY, f"READY · engine {best.newest_id}", best.newest_id, f"loads on {count} of {len(hosts)} host(s)"
        )
    if current and not column.hosts:
        best = current[0]
        known = f"{len(hosts)} known host(s), none with {column.target}" if hosts else "no host known yet"
        return make(BUILT, f"BUILT · engine {best.newest_id}", best.newest_id, f"{NO_HOST_OF_CLASS} ({known})")
    if current:
        best = current[0]
        reasons = "; ".join(sorted({reason for _, reason in verdicts[best]}))
        why = f"{REFUSED_BY_EVERY_HOST}: {reasons}"
        return make(INCOMPATIBLE, f"INCOMPATIBLE · engine {best.newest_id}", best.newest_id, why)
    if job_id is not None:
        return make(BUILDING, f"BUILDING · job {job_id}")
    unproven = sorted((g for g in groups if g.status == EngineStatus.UNPROVEN), key=lambda g: -g.newest_id)
    if ready:
        best = ready[0]
        why = f"built with {backend_label(best.backend)} {best.backend_version}; the fleet runs {newest_version}"
        if unproven:
            why += f"; imported engine {unproven[0].newest_id} is UNPROVEN"
        return make(STALE, f"STALE · engine {best.newest_id}", best.newest_id, why)
    if unproven:
        best = unproven[0]
        if best not in verdicts:
            verdicts[best] = judge(best.ref())
        could = sum(v == Verdict.COMPATIBLE for v, _ in verdicts[best])
        why = (
            f"imported, no host has loaded it yet ({could} of {len(hosts)} known host(s) could): lookups pass it "
            f"by until `enginecache test-load {best.newest_id}` passes"
        )
        return make(UNPROVEN, f"UNPROVEN · engine {best.newest_id}", best.newest_id, why)
    ended = sorted(
        (g for g in groups if g.status in (EngineStatus.FAILED, EngineStatus.RETIRED)), key=lambda g: -g.newest_id
    )
    if ended and ended[0].status == EngineStatus.FAILED:
        newest = ended[0].newest_id
        return make(FAILED, f"FAILED · engine {newest}", newest, errors.get(newest, "no reason recorded"))
    if ended:
        return make(MISSING, "MISSING", None, f"engine {ended[0].newest_id} was retired")
    return make(MISSING, "MISSING")
