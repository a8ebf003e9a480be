"""An engine as its page in the dashboard shows it: `EngineDetail`, every recorded fact the page
reads, as plain values (no catalog row reaches a view), and `engine_detail(app, engine_id)`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from enginecache.db.models import ModelRecord
from enginecache.service.context import AppContext
from enginecache.service.engines.records import engine_to_dict, get_engine


@dataclass(frozen=True)
class EngineDetail:
    """One engine: its request, its blob and how it was built. Satisfies `engines.views.EngineFacts`."""

    id: int
    model_id: int
    model: str | None  # the model's name
    variant_model_id: int | None  # the converted model it was built from, if any
    backend: str
    backend_version: str
    precision: str
    targets: str  # comma-separated, as the catalog keeps them
    status: str
    cache_key: str
    key_ingredients: dict[str, Any]  # every ingredient of its cache key, as recorded
    precision_recipe: dict[str, Any]
    build_options: dict[str, Any]
    host: dict[str, Any]  # the fingerprint of the host that built it
    io: list[dict[str, Any]]  # its inputs and outputs: name, mode, dtype, shape
    sha256: str | None
    blake3: str | None
    size_bytes: int | None
    path: str | None  # the blob in the store
    build_seconds: float | None
    verified_at: str | None  # the last re-hash (ISO 8601, UTC)
    warnings: tuple[str, ...]
    error: str | None
    builder_log: str
    job_id: int | None  # the job that built it
    provenance: dict[str, Any]  # `kind` built | imported; an import's who, from where, declared, header, unknown


def engine_detail(app: AppContext, engine_id: int) -> EngineDetail:
    """The engine with id `engine_id`. Raises NotFoundError where there is none."""
    engine = get_engine(app, engine_id)
    with app.catalog.read() as session:
        model = session.get(ModelRecord, engine.model_id)
    info = engine_to_dict(app, engine, model_name=model.name if model is not None else None, detail=True)
    return EngineDetail(
        id=engine.id or engine_id,
        model_id=engine.model_id,
        model=info["model"],
        variant_model_id=engine.variant_model_id,
        backend=engine.backend,
        backend_version=engine.backend_version,
        precision=engine.precision,
        targets=engine.targets,
        status=engine.status,
        cache_key=engine.cache_key,
        key_ingredients=engine.key_ingredients,
        precision_recipe=engine.precision_recipe,
        build_options=engine.build_options,
        host=engine.host,
        io=engine.io,
        sha256=engine.sha256,
        blake3=engine.blake3,
        size_bytes=engine.size_bytes,
        path=info["path"],
        build_seconds=engine.build_seconds,
        verified_at=info["verified_at"],
        warnings=tuple(engine.warnings),
        error=engine.error,
        builder_log=engine.builder_log,
        job_id=engine.job_id,
        provenance=info["provenance"],
    )
