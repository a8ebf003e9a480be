"""Models' read models: the model list (searchable by name or digest prefix) with engine counts
that add up (a source's own, its variants', its family's), and a model's lineage."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
import sqlalchemy.orm
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
    engines: int  # built from this very file (a source's own, or a variant's)
    family_engines: int = 0  # a source: its engines and its variants' (what `engines` of them add up to)
    parent_name: str | None = None  # a variant: its source model's name
    version: int | None = None  # a source: its version among the source models of its name (1 = oldest)

    @property
    def label(self) -> str:
        """How a selector names it: `name v2` for a source (two versions never read alike), `name
        (variant of source)` for a variant."""
        if self.parent_id is not None:
            return f"{self.name} (variant of {self.parent_name})"
        return f"{self.name} v{self.version}" if self.version is not None else self.name


def model_search(text: str | None) -> list[Any]:
    """WHERE clauses for a search: a model whose name contains `text` (any case), or whose digest
    starts with it (a hex prefix, as the lists print). Empty text: no clause."""
    text = (text or "").strip()
    if not text:
        return []
    name = sa.func.lower(col(ModelRecord.name)).contains(text.lower(), autoescape=True)
    return [sa.or_(name, col(ModelRecord.digest).startswith(text.lower(), autoescape=True))]


def model_rows(app: AppContext, *, search: str | None = None, limit: int = 500) -> list[ModelRow]:
    """Models, newest first, with how many engines each built (two grouped queries on the engines'
    model and variant columns): a source's own (no variant) and its family's (with its variants'),
    a variant's own. `search`: by name or digest prefix (`model_search`)."""
    with app.catalog.read() as session:
        return [ModelRow(**row) for row in session.execute(model_rows_query(search, limit)).mappings()]


def model_rows_query(search: str | None, limit: int) -> sa.Select[Any]:
    """`model_rows`' one statement; its two counts read only their indexes (migration 0014)."""
    engine = EngineRecord
    by_source = (
        sa.select(
            col(engine.model_id).label("mid"),
            sa.func.count().label("family"),
            sa.func.count().filter(col(engine.variant_model_id).is_(None)).label("own"),
        )
        .group_by(col(engine.model_id))
        .subquery()
    )
    by_variant = (
        sa.select(col(engine.variant_model_id).label("vid"), sa.func.count().label("n"))
        .where(col(engine.variant_model_id).is_not(None))
        .group_by(col(engine.variant_model_id))
        .subquery()
    )
    versions = (  # every source model's version, counted over all of them (a search must not renumber)
        sa.select(
            col(ModelRecord.id).label("sid"),
            sa.func.row_number()
            .over(partition_by=col(ModelRecord.name), order_by=col(ModelRecord.id))
            .label("version"),
        )
        .where(col(ModelRecord.parent_id).is_(None))
        .subquery()
    )
    parent = sa.orm.aliased(ModelRecord)
    return (
        sa.select(  # each column named as its ModelRow field
            col(ModelRecord.id),
            col(ModelRecord.name),
            col(ModelRecord.parent_id),
            col(ModelRecord.size_bytes),
            col(ModelRecord.digest),
            col(ModelRecord.created_at),
            (sa.func.coalesce(by_source.c.own, 0) + sa.func.coalesce(by_variant.c.n, 0)).label("engines"),
            sa.func.coalesce(by_source.c.family, 0).label("family_engines"),
            col(parent.name).label("parent_name"),
            versions.c.version,
        )
        .outerjoin(by_source, by_source.c.mid == col(ModelRecord.id))
        .outerjoin(versions, versions.c.sid == col(ModelRecord.id))
        .outerjoin(by_variant, by_variant.c.vid == col(ModelRecord.id))
        .outerjoin(parent, col(parent.id) == col(ModelRecord.parent_id))
        .where(*model_search(search))
        .order_by(col(ModelRecord.created_at).desc(), col(ModelRecord.id).desc())
        .limit(limit)
    )


def grouped(rows: list[ModelRow]) -> list[ModelRow]:
    """Sources in their order, each followed by its variants (oldest first); a variant whose source
    is not among `rows` (a search found it alone) keeps its place."""
    sources = {r.id for r in rows if r.parent_id is None}
    variants: dict[int, list[ModelRow]] = {}
    for row in rows:
        if row.parent_id is not None and row.parent_id in sources:
            variants.setdefault(row.parent_id, []).append(row)
    out: list[ModelRow] = []
    for row in rows:
        if row.parent_id is None:
            out.append(row)
            out += sorted(variants.get(row.id, []), key=lambda v: v.id)
        elif row.parent_id not in sources:
            out.append(row)
    return out


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
