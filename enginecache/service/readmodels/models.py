"""Models' read models: the model list with engine counts, and a model's lineage."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord
from enginecache.errors import NotFoundError
from enginecache.service.context import AppContext

LINEAGE_GROUPS_MAX = 200


@dataclass(frozen=True)
class LineageEngine:
    model_id: int
    backend: str
    precision: str
    targets: str
    status: str
    count: int
    newest_id: int


@dataclass(frozen=True)
class Lineage:
    source: ModelRecord
    variants: list[ModelRecord]
    engines: list[LineageEngine] = field(default_factory=list)


def model_lineage(app: AppContext, model_id: int) -> Lineage:
    """A source model, its converted variants, and its engines grouped by backend, precision,
    targets and status (engines built from a variant are counted under their source model)."""
    with app.catalog.read() as session:
        model = session.get(ModelRecord, model_id)
        if model is None:
            raise NotFoundError(f"no model with id {model_id} in the catalog")
        source = model
        while source.parent_id is not None:
            parent = session.get(ModelRecord, source.parent_id)
            if parent is None:
                break
            source = parent
        variants = list(
            session.exec(
                select(ModelRecord).where(ModelRecord.parent_id == source.id).order_by(col(ModelRecord.id))
            ).all()
        )
        groups = session.execute(
            sa.select(
                col(EngineRecord.variant_model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(EngineRecord.status),
                sa.func.count(),
                sa.func.max(col(EngineRecord.id)),
            )
            .where(col(EngineRecord.model_id) == source.id)
            .group_by(
                col(EngineRecord.variant_model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(EngineRecord.status),
            )
            .order_by(col(EngineRecord.precision), col(EngineRecord.targets))
            .limit(LINEAGE_GROUPS_MAX)
        ).all()
    engines = [
        LineageEngine(
            model_id=int(g[0]) if g[0] is not None else int(source.id or 0),
            backend=str(g[1]),
            precision=str(g[2]),
            targets=str(g[3]),
            status=str(g[4]),
            count=int(g[5]),
            newest_id=int(g[6]),
        )
        for g in groups
    ]
    return Lineage(source=source, variants=variants, engines=engines)


@dataclass(frozen=True)
class ModelRow:
    id: int
    name: str
    parent_id: int | None
    size_bytes: int
    digest: str
    created_at: datetime
    engines: int


def model_rows(app: AppContext, *, limit: int = 500) -> list[ModelRow]:
    """Models, newest first, with how many engines each has (one grouped query)."""
    engine_counts = (
        sa.select(col(EngineRecord.model_id).label("mid"), sa.func.count().label("n"))
        .group_by(col(EngineRecord.model_id))
        .subquery()
    )
    query = (
        sa.select(  # each column named as its ModelRow field
            col(ModelRecord.id),
            col(ModelRecord.name),
            col(ModelRecord.parent_id),
            col(ModelRecord.size_bytes),
            col(ModelRecord.digest),
            col(ModelRecord.created_at),
            sa.func.coalesce(engine_counts.c.n, 0).label("engines"),
        )
        .outerjoin(engine_counts, engine_counts.c.mid == col(ModelRecord.id))
        .order_by(col(ModelRecord.created_at).desc(), col(ModelRecord.id).desc())
        .limit(limit)
    )
    with app.catalog.read() as session:
        return [ModelRow(**row) for row in session.execute(query).mappings()]


def working_precisions(app: AppContext, model_id: int) -> tuple[str, ...]:
    """The precisions this model has a READY engine in (from the source or any of its variants),
    sorted: the ones known to work for it on this catalog's hosts."""
    with app.catalog.read() as session:
        found = session.execute(
            sa.select(col(EngineRecord.precision))
            .where(col(EngineRecord.model_id) == model_id, col(EngineRecord.status) == EngineStatus.READY)
            .distinct()
        ).all()
    return tuple(sorted(str(row[0]) for row in found))


def default_precisions(working: tuple[str, ...]) -> list[str]:
    """What a build form preselects: fp32, which builds for every model the backend parses, plus
    fp16 only where an fp16 engine of this model already built; never a preselected failure."""
    return ["fp32", *(["fp16"] if "fp16" in working else [])]
