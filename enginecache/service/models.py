"""Use cases for models: register (inspect, hash, store, record), find, list."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.onnx_info import TensorInfo, inspect_model
from enginecache.db.models import ModelRecord
from enginecache.errors import AmbiguousError, NotFoundError
from enginecache.service.context import AppContext

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegisterResult:
    model: ModelRecord
    created: bool


def register_model(
    app: AppContext,
    path: Path,
    *,
    name: str | None = None,
    parent_id: int | None = None,
    recipe: dict[str, Any] | None = None,
    recipe_key: str | None = None,
) -> RegisterResult:
    """Inspect and hash `path`, copy it (and its external data) into the store, record it.

    The same bytes registered twice return the existing record. Bad input raises an
    InvalidModelError before anything is stored.
    """
    info = inspect_model(Path(path))
    existing = find_model_by_digest(app, info.digest)
    if existing is not None:
        return RegisterResult(existing, created=False)
    stored = app.store.put_model_bundle(info.path, info.external_data_files, info.digest)
    record = ModelRecord(
        name=name or info.path.stem,
        digest=info.digest,
        filename=info.path.name,
        store_path=app.store.relative(stored),
        size_bytes=info.size_bytes,
        info={**info.to_dict(), "path": app.store.relative(stored)},
        parent_id=parent_id,
        recipe=recipe or {},
        recipe_key=recipe_key,
    )
    try:
        with app.catalog.write() as session:
            session.add(record)
    except sa.exc.IntegrityError:
        # Registered concurrently by another process: same digest, same bytes.
        concurrent = find_model_by_digest(app, info.digest)
        if concurrent is None:
            raise
        return RegisterResult(concurrent, created=False)
    logger.info("registered model %s (%s) as id %s", record.name, info.digest[:12], record.id)
    return RegisterResult(record, created=True)


def find_model_by_digest(app: AppContext, digest: str) -> ModelRecord | None:
    with app.catalog.read() as session:
        return session.exec(select(ModelRecord).where(ModelRecord.digest == digest)).first()


def get_model(app: AppContext, ref: str | int) -> ModelRecord:
    """A model by id, digest (or a unique prefix of 12+ hex chars), or name (newest source model)."""
    text = str(ref)
    with app.catalog.read() as session:
        if text.isdigit():
            found = session.get(ModelRecord, int(text))
            if found is not None:
                return found
        by_name = session.exec(
            select(ModelRecord)
            .where(ModelRecord.name == text)
            .order_by(col(ModelRecord.parent_id).is_not(None), col(ModelRecord.created_at).desc())
        ).all()
        if by_name:
            return by_name[0]
        if len(text) >= 12:
            by_digest = session.exec(select(ModelRecord).where(col(ModelRecord.digest).startswith(text))).all()
            if len(by_digest) > 1:
                raise AmbiguousError(f"digest prefix {text!r} matches {len(by_digest)} models")
            if by_digest:
                return by_digest[0]
    raise NotFoundError(f"no model {text!r} in the catalog (give a name, an id or a digest)")


def list_models(app: AppContext) -> list[ModelRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(ModelRecord).order_by(col(ModelRecord.created_at).desc())).all())


def model_path(app: AppContext, model: ModelRecord) -> Path:
    return app.home / model.store_path


def model_inputs(model: ModelRecord) -> tuple[TensorInfo, ...]:
    """The model's inputs as recorded at registration."""
    inputs = model.info.get("inputs", [])
    return tuple(TensorInfo(name=t["name"], dtype=t["dtype"], shape=tuple(t["shape"])) for t in inputs)


def model_to_dict(model: ModelRecord) -> dict[str, Any]:
    return {
        "id": model.id,
        "name": model.name,
        "digest": model.digest,
        "filename": model.filename,
        "store_path": model.store_path,
        "size_bytes": model.size_bytes,
        "parent_id": model.parent_id,
        "recipe": model.recipe or None,
        "created_at": model.created_at.isoformat(),
        **{k: v for k, v in model.info.items() if k not in ("path", "digest", "size_bytes")},
    }
