"""Engines' read models: one filtered page of engines (a search by model name or digest prefix among
the filters), the filters' options, cache-key ingredients."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import col

from enginecache.core.cachekey import INGREDIENTS
from enginecache.core.targettext import split_targets
from enginecache.db.models import EngineRecord, ModelRecord
from enginecache.service.context import AppContext

ENGINE_PAGE_MAX = 500


@dataclass(frozen=True)
class EngineFilter:
    model_id: int | None = None
    backend: str | None = None
    precision: str | None = None
    status: str | None = None
    target: str | None = None  # one compute capability or CPU target contained in `targets`
    since: datetime | None = None
    until: datetime | None = None
    search: str | None = (
        None  # the model's name contains it, or the model's digest or the engine's sha256 starts with it
    )


@dataclass(frozen=True)
class EngineRow:
    id: int
    model: str
    model_id: int
    backend: str
    precision: str
    targets: str
    status: str
    size_bytes: int | None
    build_seconds: float | None
    sha256: str | None
    created_at: datetime


@dataclass(frozen=True)
class EnginePage:
    rows: list[EngineRow]
    total: int
    offset: int
    limit: int


def _engine_where(spec: EngineFilter) -> list[Any]:
    where: list[Any] = []
    if spec.model_id is not None:
        # a source model's engines, or a converted variant's (filed under its source, built from it)
        where.append(
            sa.or_(col(EngineRecord.model_id) == spec.model_id, col(EngineRecord.variant_model_id) == spec.model_id)
        )
    if spec.backend:
        where.append(col(EngineRecord.backend) == spec.backend)
    if spec.precision:
        where.append(col(EngineRecord.precision) == spec.precision)
    if spec.status:
        where.append(col(EngineRecord.status) == spec.status.upper())
    if spec.target:
        target = spec.target.strip().lower()
        # targets is comma-joined: match a whole item, not a prefix of another (sm8 vs sm86)
        where.append(
            sa.or_(
                col(EngineRecord.targets) == target,
                col(EngineRecord.targets).startswith(target + ","),
                col(EngineRecord.targets).endswith("," + target),
                col(EngineRecord.targets).contains("," + target + ","),
            )
        )
    if spec.since is not None:
        where.append(col(EngineRecord.created_at) >= spec.since)
    if spec.until is not None:
        where.append(col(EngineRecord.created_at) < spec.until)
    text = (spec.search or "").strip().lower()
    if text:
        where.append(
            sa.or_(
                sa.func.lower(col(ModelRecord.name)).contains(text, autoescape=True),
                col(ModelRecord.digest).startswith(text, autoescape=True),
                col(EngineRecord.sha256).startswith(text, autoescape=True),
            )
        )
    return where


def engine_page(app: AppContext, spec: EngineFilter, *, offset: int = 0, limit: int = 50) -> EnginePage:
    """One page of engines matching `spec`, newest first, and how many match in all."""
    limit = max(1, min(limit, ENGINE_PAGE_MAX))
    offset = max(0, offset)
    where = _engine_where(spec)
    with app.catalog.read() as session:
        counted = sa.select(sa.func.count()).select_from(EngineRecord)
        if spec.search:  # the search reads the model's name and digest
            counted = counted.join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
        total = session.execute(counted.where(*where)).scalar_one()
        rows = session.execute(
            sa.select(  # each column named as its EngineRow field
                col(EngineRecord.id),
                col(ModelRecord.name).label("model"),
                col(EngineRecord.model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(EngineRecord.status),
                col(EngineRecord.size_bytes),
                col(EngineRecord.build_seconds),
                col(EngineRecord.sha256),
                col(EngineRecord.created_at),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(*where)
            .order_by(col(EngineRecord.created_at).desc(), col(EngineRecord.id).desc())
            .offset(offset)
            .limit(limit)
        ).mappings()
        page = [EngineRow(**row) for row in rows]
    return EnginePage(rows=page, total=int(total), offset=offset, limit=limit)


@dataclass(frozen=True)
class FilterOptions:
    models: list[tuple[int, str]]
    backends: list[str]
    precisions: list[str]
    statuses: list[str]
    targets: list[str]


def engine_filter_options(app: AppContext) -> FilterOptions:
    """The distinct values each engine filter can take (DISTINCT over indexed columns)."""
    with app.catalog.read() as session:
        models = session.execute(
            sa.select(col(ModelRecord.id), col(ModelRecord.name)).order_by(col(ModelRecord.name), col(ModelRecord.id))
        ).all()
        backends = session.execute(sa.select(col(EngineRecord.backend)).distinct()).scalars().all()
        precisions = session.execute(sa.select(col(EngineRecord.precision)).distinct()).scalars().all()
        statuses = session.execute(sa.select(col(EngineRecord.status)).distinct()).scalars().all()
        target_sets = session.execute(sa.select(col(EngineRecord.targets)).distinct()).scalars().all()
    targets = sorted({t for joined in target_sets for t in split_targets(str(joined))})
    return FilterOptions(
        models=[(int(i), str(n)) for i, n in models],
        backends=sorted(str(b) for b in backends),
        precisions=sorted(str(p) for p in precisions),
        statuses=sorted(str(s) for s in statuses),
        targets=targets,
    )


def ingredient_rows(ingredients: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The cache-key ingredients in their display order (schema, digest, precision, ...)."""
    return [(name, ingredients.get(name)) for name in INGREDIENTS]
