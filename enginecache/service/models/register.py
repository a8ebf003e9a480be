"""Use cases for models: register (inspect, hash, store, record; repair a damaged stored bundle), find, list."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.bundleremote import upload_bundle
from enginecache.core.hashing import DigestResult
from enginecache.core.names import check_model_name, name_from_filename
from enginecache.core.onnx_info import TensorInfo, inspect_model
from enginecache.db.catalog import ConnectionRows
from enginecache.db.models import ModelRecord
from enginecache.errors import ModelNameTakenError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.models.verify import bundle_path, restore_bundle
from enginecache.service.readmodels.listing import (
    catalog_rows,
    model_aliases,
    model_dict,
    model_version,
    resolve_model_id,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegisterResult:
    model: ModelRecord
    created: bool
    repaired: bool = False  # bytes already registered whose stored bundle was damaged (or marked CORRUPT)


def register_model(
    app: AppContext,
    path: Path,
    *,
    name: str | None = None,
    parent_id: int | None = None,
    recipe: dict[str, Any] | None = None,
    recipe_key: str | None = None,
    new_version: bool = False,
) -> RegisterResult:
    """Inspect and hash `path`, copy it (and its external data) into the store, record it.

    The same bytes registered twice return the existing record, after checking that its stored
    bundle still hashes to the digest: a damaged or missing one is rewritten from `path` (itself
    hashed to that digest first) and a CORRUPT model set back to OK (`repaired`). Bad input raises an
    InvalidModelError before anything is stored. A source model's name must match
    `core.names` (ModelNameError otherwise; without a name, one is made from the file name,
    `default_model_name`), and a name another source model holds with other bytes is refused
    (ModelNameTakenError) unless `new_version` (the newest model of a name is the one the name
    resolves to): nothing takes a name over silently.
    """
    access.require(app, "upload")
    if parent_id is None and name is not None:
        check_model_name(name)  # before any work
    info = inspect_model(Path(path))
    existing = find_model_by_digest(app, info.digest)
    if existing is not None:
        if restore_bundle(app, existing, info.path):
            repaired = find_model_by_digest(app, info.digest) or existing
            audit.record(app, audit.MODEL_REPAIR, f"model {repaired.id}", _audit_details(repaired))
            return RegisterResult(repaired, created=False, repaired=True)
        return RegisterResult(existing, created=False)
    if parent_id is None:
        name = name if name is not None else name_from_filename(info.path.stem)
        if not new_version:
            _refuse_taken_name(app, name)
    copied: dict[str, DigestResult] | None = {} if app.store.remote is not None else None
    stored = app.store.put_model_bundle(info.path, info.external_data_files, info.digest, digests=copied)
    names = [info.path.name, *info.external_data_files]
    remote_files = upload_bundle(app.store, info.digest, names, known=copied)
    record = ModelRecord(
        name=name or info.path.stem,
        digest=info.digest,
        filename=info.path.name,
        store_path=app.store.relative(stored),
        size_bytes=info.size_bytes,
        info={
            **info.to_dict(),
            "path": app.store.relative(stored),
            **({"remote_files": remote_files} if remote_files else {}),
        },
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
    details = {**_audit_details(record), "new_version": new_version}
    audit.record(app, audit.MODEL_REGISTER, f"model {record.id}", details)
    return RegisterResult(record, created=True)


def default_model_name(filename: str) -> str:
    """The name a model file registered without one gets: its stem, made a valid name (`core.names`)."""
    return name_from_filename(Path(filename).stem)


def _audit_details(model: ModelRecord) -> dict[str, Any]:
    return {
        "name": model.name,
        "digest": model.digest,
        "filename": model.filename,
        "size_bytes": model.size_bytes,
        "parent_id": model.parent_id,
        "recipe_key": model.recipe_key,
    }


def _refuse_taken_name(app: AppContext, name: str) -> None:
    with app.catalog.read() as session:
        holder = session.exec(
            select(ModelRecord).where(ModelRecord.name == name, col(ModelRecord.parent_id).is_(None)).limit(1)
        ).first()
    if holder is not None:
        raise ModelNameTakenError(
            f"model name {name!r} is taken by model {holder.id} (sha256 {holder.digest[:16]}...), other bytes; "
            "register these bytes as its new version (--new-version), or choose another name (--name)",
            name=name,
        )


def find_model_by_digest(app: AppContext, digest: str) -> ModelRecord | None:
    with app.catalog.read() as session:
        return session.exec(select(ModelRecord).where(ModelRecord.digest == digest)).first()


def get_model(app: AppContext, ref: str | int) -> ModelRecord:
    """The model `ref` names: an id, a name (its newest version), NAME@vN, NAME@ALIAS (for this host's
    GPU class), a digest or a unique prefix of 12+ hex chars of one (`service.readmodels.modelrefs`)."""
    with app.catalog.read() as session:
        found = session.get(ModelRecord, resolve_model_id(ConnectionRows(session.connection()), ref))
    if found is None:  # deleted between the two statements
        raise NotFoundError(f"no model {ref!r} in the catalog")
    return found


def list_models(app: AppContext, *, limit: int | None = None, offset: int = 0) -> list[ModelRecord]:
    """Models, newest first (the id breaking ties), one page of them with `limit`/`offset`; the CLI
    streams them instead (`service.readmodels.listing.stream_models`)."""
    query = select(ModelRecord).order_by(col(ModelRecord.created_at).desc(), col(ModelRecord.id).desc())
    with app.catalog.read() as session:
        return list(session.exec(query.offset(offset).limit(limit)).all())


def model_path(app: AppContext, model: ModelRecord) -> Path:
    """The stored model file, derived from the model's digest (`models/<digest>/<file name>`), not from
    the catalog's `store_path`: an edited row cannot point a build at other bytes."""
    return bundle_path(app, model)


def model_inputs(model: ModelRecord) -> tuple[TensorInfo, ...]:
    """The model's inputs as recorded at registration."""
    inputs = model.info.get("inputs", [])
    return tuple(TensorInfo(name=t["name"], dtype=t["dtype"], shape=tuple(t["shape"])) for t in inputs)


def model_to_dict(app: AppContext, model: ModelRecord) -> dict[str, Any]:
    """`model_dict` of a record, with its version and the aliases that point at it read from the catalog."""
    with catalog_rows(app) as source:
        version = model_version(source, model.id)
        aliases = model_aliases(source, [model.name]).get(model.id or 0, ())
    return model_dict(model, version=version, aliases=aliases)
