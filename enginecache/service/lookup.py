"""Finding the engine a serving host should load, and saying why there is none.

The engine for a plan is the READY one with its cache key, or one whose key differs only in its
target list (a TensorRT-RTX engine built for several SMs); either only where the backend's
compatibility rule (`Backend.compatibility`, the one `check` and the dashboard use) says this host
can load it. A miss names the nearest engine and the key ingredients that differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.registry import get_backend
from enginecache.core.cachekey import FieldDiff, diff_ingredients
from enginecache.core.fingerprint import HostFingerprint
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord
from enginecache.errors import MissError
from enginecache.service.builds import BuildPlan, find_ready_engine
from enginecache.service.context import AppContext
from enginecache.service.enginerefs import engine_ref, engine_targets


def _loadable(engine: EngineRecord, host: HostFingerprint) -> bool:
    return get_backend(engine.backend).compatibility(engine_ref(engine), host).compatible


def _target_free(ingredients: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in ingredients.items() if k != "target"}


def _engines_of_model(app: AppContext, model_id: int) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(
            session.exec(
                select(EngineRecord)
                .where(EngineRecord.model_id == model_id, EngineRecord.status == EngineStatus.READY)
                .order_by(col(EngineRecord.id).desc())
            ).all()
        )


def find_engine(app: AppContext, plan: BuildPlan, host: HostFingerprint) -> EngineRecord | None:
    """The READY engine with the plan's cache key where this host can load it, else the newest one
    whose key differs only in its target list that this host can load, else the exact one anyway
    (loading it then says why not: INCOMPATIBLE), else None."""
    exact = find_ready_engine(app, plan.cache_key)
    if exact is not None and _loadable(exact, host):
        return exact
    wanted = _target_free(plan.ingredients)
    for engine in _engines_of_model(app, plan.model.id or 0):
        if _target_free(engine.key_ingredients) == wanted and _loadable(engine, host):
            return engine
    return exact


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
    candidates = _engines_of_model(app, plan.model.id or 0)
    head = f"no engine for {plan.model.name} {_wanted(plan, host)}"
    if not candidates:
        return MissError(f"{head}; the model has no READY engine at all")
    scored = [(diff_ingredients(e.key_ingredients, plan.ingredients), e) for e in candidates]
    diffs, nearest = min(scored, key=lambda pair: (len(pair[0]), -(pair[1].id or 0)))
    backend = get_backend(nearest.backend)
    if not diffs and not backend.covers(engine_targets(nearest), host):
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
        f"{backend.show_targets(engine_targets(nearest))}) built {_age(nearest.created_at)}; differing fields: {shown}",
        nearest=summary,
        diffs=diffs,
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
