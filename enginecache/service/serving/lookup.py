"""Finding the engine a serving host should load, and saying why there is none.

The engine for a plan is the READY one with its cache key, or one whose key differs only in its
target list (a TensorRT-RTX engine built for several SMs); either only where the backend's
compatibility rule (`Backend.compatibility`, the one `check` and the dashboard use) says this host
can load it. A miss names the nearest engine and the key ingredients that differ, and says where
the model has UNPROVEN (imported) engines of the plan's backend and precision, which no lookup returns.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.backends.base import EngineRef
from enginecache.core.backends.registry import get_backend
from enginecache.core.cachekey import FieldDiff, diff_ingredients
from enginecache.core.fingerprint import HostFingerprint
from enginecache.core.targettext import split_targets
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord
from enginecache.errors import MissError
from enginecache.service.builds.plan import BuildPlan, find_ready_engine
from enginecache.service.context import AppContext
from enginecache.service.jobs.refs import engine_ref

# -- candidates: the few values a decision needs, never whole rows --------------------------------
#
# A model can have thousands of READY engines (every target set x precision x option tried), and a
# row carries the build host's fingerprint, the builder log and IO: reading them all in full, as
# ORM objects, costs seconds. The scans below read an engine's id, the columns they filter or order
# on and its key ingredients as JSON text, parsed only where it is compared; the rest of a row only
# for the engine they settle on.
#
# Both lean on the columns that mirror key ingredients: `create_pending_engine` (the one writer of
# engine rows; nothing updates these) fills backend, backend_version, os, onnx_digest, precision,
# precision_recipe, build_options and target_info from the same plan as the key ingredients
# "backend", "backend_version", "os", "onnx_digest", "precision" (its "name"), "build_options" and
# "target". So an engine whose column differs from the plan's differs in that ingredient: SQL can
# drop it (find_engine), and the columns bound its diffs (explain_miss).


def _ready_of_model(model_id: int) -> list[Any]:
    return [col(EngineRecord.model_id) == model_id, col(EngineRecord.status) == EngineStatus.READY]


def _mirrored(plan: BuildPlan) -> list[tuple[Any, Any]]:
    """(column, the plan's ingredient) for each column that mirrors one key ingredient."""
    ingredients = plan.ingredients
    precision = ingredients.get("precision")
    return [
        (col(EngineRecord.backend), ingredients.get("backend")),
        (col(EngineRecord.backend_version), ingredients.get("backend_version")),
        (col(EngineRecord.os), ingredients.get("os")),
        (col(EngineRecord.precision), precision.get("name") if isinstance(precision, Mapping) else None),
    ]


_INGREDIENTS_TEXT = sa.cast(col(EngineRecord.key_ingredients), sa.Text)  # parsed only where compared


def _parse(text: Any) -> dict[str, Any]:
    return dict(text) if isinstance(text, Mapping) else dict(json.loads(text))


def _loadable(engine: EngineRecord | EngineRef, host: HostFingerprint) -> bool:
    ref = engine if isinstance(engine, EngineRef) else engine_ref(engine)
    return get_backend(engine.backend).compatibility(ref, host).compatible


def _target_free(ingredients: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ingredients.items() if k != "target"}


def find_engine(app: AppContext, plan: BuildPlan, host: HostFingerprint) -> EngineRecord | None:
    """The READY engine with the plan's cache key where this host can load it, else the newest one
    whose key differs only in its target list that this host can load, else the exact one anyway
    (loading it then says why not: INCOMPATIBLE), else None.

    The fallback scans, newest first, only the model's READY engines with the plan's backend,
    backend version, OS and precision (no other can differ in the target alone), reading what the
    compatibility rule decides on and the key ingredients as text: parsed only for an engine this
    host can load, the full row only of the engine returned."""
    exact = find_ready_engine(app, plan.cache_key)
    if exact is not None and _loadable(exact, host):
        return exact
    wanted = _target_free(plan.ingredients)
    query = (
        sa.select(
            col(EngineRecord.id),
            col(EngineRecord.backend),
            col(EngineRecord.backend_version),
            col(EngineRecord.targets),
            col(EngineRecord.precision),
            col(EngineRecord.os),
            _INGREDIENTS_TEXT,
        )
        .where(*_ready_of_model(plan.model.id or 0), *[column == value for column, value in _mirrored(plan)])
        .order_by(col(EngineRecord.id).desc())
    )
    loadable: dict[EngineRef, bool] = {}  # the rule's answer per distinct set of facts (a few dozen)
    match: int | None = None
    with app.catalog.read() as session:
        rows = session.connection().execute(query)  # Core: row by row, nothing kept but the answer
        for engine_id, backend, version, targets, precision, os_name, text in rows:
            ref = EngineRef(
                backend=backend,
                backend_version=version,
                targets=split_targets(targets),
                precision=precision,
                os=os_name,
            )
            if ref not in loadable:
                loadable[ref] = _loadable(ref, host)
            if loadable[ref] and _target_free(_parse(text)) == wanted:
                match = engine_id
                break
        rows.close()
        found = session.get(EngineRecord, match) if match is not None else None
    return found if found is not None and found.status == EngineStatus.READY else exact


def _count_diffs(left: Mapping[str, Any], right: Mapping[str, Any], limit: int) -> int:
    """`len(diff_ingredients(left, right))` where that is at most `limit`, else a number above it:
    equal ingredients are passed over by one comparison, and the count stops once past `limit`."""
    count = 0
    for name in left.keys() | right.keys():
        a, b = left.get(name), right.get(name)
        if a == b:
            continue
        if type(a) in _LEAVES or type(b) in _LEAVES or not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            count += 1
        else:
            count += _count_diffs(a, b, limit - count)
        if count > limit:
            break
    return count


_LEAVES = frozenset({str, int, float, bool, list, type(None)})  # never a Mapping: no ABC check needed

# Key ingredient -> the column `create_pending_engine` fills with it (a JSON column as its text).
_MIRROR_COLUMNS: dict[str, Any] = {
    "backend": col(EngineRecord.backend),
    "backend_version": col(EngineRecord.backend_version),
    "os": col(EngineRecord.os),
    "onnx_digest": col(EngineRecord.onnx_digest),
    "precision": sa.cast(col(EngineRecord.precision_recipe), sa.Text),
    "build_options": sa.cast(col(EngineRecord.build_options), sa.Text),
    "target": sa.cast(col(EngineRecord.target_info), sa.Text),
}
_JSON_MIRRORS = frozenset({"precision", "build_options", "target"})


class _MirroredDiffs:
    """Differing leaves of the ingredients that columns mirror, per engine, from those columns: each
    distinct value (a model's engines share a few dozen build options, targets and recipes) is parsed
    and diffed against the plan once. Summed, they bound an engine's diffs from below (ingredients no
    column mirrors, "schema" and any other, are not counted)."""

    def __init__(self, wanted: Mapping[str, Any]) -> None:
        self.wanted = wanted
        self.names = [name for name in _MIRROR_COLUMNS if name in wanted]
        self._memo: dict[tuple[str, Any], int] = {}

    @property
    def columns(self) -> list[Any]:
        return [_MIRROR_COLUMNS[name] for name in self.names]

    def count(self, values: Any) -> int:
        total = 0
        for name, value in zip(self.names, values, strict=True):
            n = self._memo.get((name, value))
            if n is None:
                mine = json.loads(value) if name in _JSON_MIRRORS and isinstance(value, str) else value
                n = len(diff_ingredients({name: mine}, {name: self.wanted[name]}))
                self._memo[(name, value)] = n
            total += n
        return total


@dataclass(frozen=True)
class _Nearest:
    id: int
    backend: str
    precision: str
    targets: str
    created_at: datetime
    diffs: list[FieldDiff]

    @property
    def target_tuple(self) -> tuple[str, ...]:
        return split_targets(self.targets)


_ID_BITS = 48
_ID_MASK = (1 << _ID_BITS) - 1

_NEAREST_DETAIL = sa.select(
    col(EngineRecord.backend),
    col(EngineRecord.precision),
    col(EngineRecord.targets),
    col(EngineRecord.created_at),
    _INGREDIENTS_TEXT,
).where(col(EngineRecord.id) == sa.bindparam("engine_id"))


def _nearest(app: AppContext, plan: BuildPlan) -> _Nearest | None:
    """The READY engine of the plan's model with the fewest differing key-ingredient leaves (the
    newest of those), with its diffs; None where the model has no READY engine.

    One query reads each engine's id and the columns that mirror its ingredients (`_MirroredDiffs`:
    a lower bound of its diffs, exact unless an unmirrored ingredient differs). Engines are then
    taken in (bound, newest first) order and verified on their full ingredients until the next
    one's bound cannot beat the best verified: usually the first is the answer. Should a verified
    engine differ less than its columns say (a row whose columns do not mirror its ingredients),
    the bounds cannot be trusted and every engine is compared on its ingredients instead."""
    wanted = plan.ingredients
    mirrored = _MirroredDiffs(wanted)
    query = sa.select(col(EngineRecord.id), *mirrored.columns).where(*_ready_of_model(plan.model.id or 0))
    best: tuple[int, int, _Nearest] | None = None  # (diffs, -id, engine)
    with app.catalog.read() as session:
        # Rows are taken one at a time and each leaves one int behind (bound, then newest first):
        # no list of rows or tuples builds up to wake the garbage collector over the whole heap.
        rows = session.connection().execute(query)  # Core: fetched row by row (the ORM fetches all first)
        keys = sorted((mirrored.count(row[1:]) << _ID_BITS) | (_ID_MASK - int(row[0])) for row in rows)
        for key in keys:
            bound, negative_id = key >> _ID_BITS, (key & _ID_MASK) - _ID_MASK
            if best is not None and (bound, negative_id) >= best[:2]:
                break
            found = session.execute(_NEAREST_DETAIL, {"engine_id": -negative_id}).first()
            if found is None:
                continue
            backend, precision, targets, created_at, text = found
            diffs = diff_ingredients(_parse(text), wanted)
            if len(diffs) < bound:
                return _nearest_by_ingredients(session, plan)
            if best is None or (len(diffs), negative_id) < best[:2]:
                best = (len(diffs), negative_id, _Nearest(-negative_id, backend, precision, targets, created_at, diffs))
    return best[2] if best is not None else None


def _nearest_by_ingredients(session: Any, plan: BuildPlan) -> _Nearest | None:
    """`_nearest` from every READY engine's ingredients (as text, parsed; counted only as far as the
    best so far), for a catalog whose columns cannot bound the diffs."""
    wanted = plan.ingredients
    query = sa.select(col(EngineRecord.id), _INGREDIENTS_TEXT).where(*_ready_of_model(plan.model.id or 0))
    best: tuple[int, int] | None = None
    for engine_id, text in session.execute(query):
        count = _count_diffs(_parse(text), wanted, best[0] if best is not None else len(wanted) << 20)
        if best is None or (count, -engine_id) < best:
            best = (count, -engine_id)
    if best is None:
        return None
    backend, precision, targets, created_at, text = session.execute(_NEAREST_DETAIL, {"engine_id": -best[1]}).one()
    return _Nearest(-best[1], backend, precision, targets, created_at, diff_ingredients(_parse(text), wanted))


def _age(when: datetime) -> str:
    seconds = (datetime.now(UTC) - when).total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''} ago"
    return "just now"


def _wanted(plan: BuildPlan, host: HostFingerprint) -> str:
    backend = plan.backend
    where = backend.show_targets(tuple(backend.host_target(host).split(",")))
    return f"{backend.name} {plan.precision.precision} for {where}"


def explain_miss(app: AppContext, plan: BuildPlan, host: HostFingerprint) -> MissError:
    """'no engine for rtx fp16 for SM86; nearest: engine 4 (rtx fp16 SM89) built 2 days ago; differing fields: ...'."""
    head = f"no engine for {plan.model.name} {_wanted(plan, host)}"
    broken = _broken_exact_match(app, plan)
    if broken is not None:
        engine_id, status = broken
        targets = f" --target {','.join(plan.targets)}" if plan.targets else ""
        rebuild = (
            f"`enginecache build {plan.model.name} --backend {plan.backend.name} "
            f"--precision {plan.precision.precision}{targets}`"
        )
        why, fix = _BROKEN[status]
        return MissError(
            f"{head}; engine {engine_id} is the exact match but {status} ({why}): {fix} and run "
            f"`enginecache verify {engine_id}`, or build it again: {rebuild}",
            nearest={"id": engine_id, "status": status, "exact": True},
        )
    unproven = _unproven_note(app, plan)
    if unproven:
        head = f"{head}; {unproven}"
    nearest = _nearest(app, plan)
    if nearest is None:
        return MissError(f"{head}; the model has no READY engine at all")
    diffs = nearest.diffs
    backend = get_backend(nearest.backend)
    if not diffs and not backend.covers(nearest.target_tuple, host):
        diffs = [FieldDiff("target (host)", nearest.targets, backend.host_target(host))]
    shown = "; ".join(f"{d.field}: {d.left!r} -> {d.right!r}" for d in diffs[:6])
    summary = {
        "id": nearest.id,
        "backend": nearest.backend,
        "precision": nearest.precision,
        "targets": nearest.targets,
        "created_at": nearest.created_at.isoformat(),
    }
    return MissError(
        f"{head}; nearest: engine {nearest.id} ({nearest.backend} {nearest.precision} "
        f"{backend.show_targets(nearest.target_tuple)}) built {_age(nearest.created_at)}; differing fields: {shown}",
        nearest=summary,
        diffs=diffs,
    )


# Why an exact match cannot serve, and what restores it, by its status.
_BROKEN = {
    EngineStatus.CORRUPT.value: ("its blob no longer hashes to its digest", "restore the blob"),
    EngineStatus.TAMPERED.value: (
        "its row no longer says what its signed statement says",
        "restore its row (a backup's)",
    ),
}


def _broken_exact_match(app: AppContext, plan: BuildPlan) -> tuple[int, str] | None:
    """The newest engine of exactly this cache key that is CORRUPT or TAMPERED, and its status,
    where one is."""
    query = (
        select(EngineRecord.id, EngineRecord.status)
        .where(EngineRecord.cache_key == plan.cache_key, col(EngineRecord.status).in_(tuple(_BROKEN)))
        .order_by(col(EngineRecord.id).desc())
    )
    with app.catalog.read() as session:
        found = session.exec(query).first()
    if found is None or found[0] is None:
        return None
    return int(found[0]), str(found[1])


def _unproven_note(app: AppContext, plan: BuildPlan) -> str:
    """Words for the model's UNPROVEN (imported) engines of the plan's backend and precision, which no
    lookup returns until a host that can run one has loaded it; "" where there are none."""
    query = (
        select(EngineRecord.id)
        .where(
            col(EngineRecord.model_id) == plan.model.id,
            col(EngineRecord.backend) == plan.backend.name,
            col(EngineRecord.precision) == plan.precision.precision,
            col(EngineRecord.status) == EngineStatus.UNPROVEN,
        )
        .order_by(col(EngineRecord.id).desc())
        .limit(5)
    )
    with app.catalog.read() as session:
        found = list(session.exec(query).all())
    if not found:
        return ""
    ids = ", ".join(str(i) for i in found)
    return (
        f"imported engine {ids} is UNPROVEN (no host has loaded it yet; lookups return proven engines only): "
        f"prove it with `enginecache test-load {found[0]}` on a host that can run it"
    )


def unknown_model_miss(app: AppContext, path: Path, digest: str) -> MissError:
    """No model with this digest; a hint where a model of the same file name is registered with
    other bytes (the file changed since)."""
    message = f"no model with digest {digest[:16]}... ({path.name}) in the catalog"
    with app.catalog.read() as session:
        same_name = session.exec(
            select(ModelRecord).where(ModelRecord.filename == path.name).order_by(col(ModelRecord.id).desc())
        ).first()
    if same_name is None:
        return MissError(message)
    return MissError(
        f"{message}; model {same_name.name!r} (id {same_name.id}) has the same file name with digest "
        f"{same_name.digest[:16]}...: the file's bytes changed since it was registered"
    )
