"""Use case: `engine import`: register an engine file built elsewhere (CI's `trtexec`, a team's own
build script, `trtllm-build`) against a registered model.

What is declared (backend, targets, precision, library version, profiles, notes) is checked against
what the file's own header proves (`core.backends.headerfacts`: TensorRT-RTX's validity check, the
version that wrote it and the compute capabilities it was built for): bytes that are not an engine of
the declared backend, or a header that contradicts the declaration, are refused (ImportRefusedError,
naming both values) before anything is stored. The file is then copied into the store while it is
hashed (sha256, BLAKE3, its header's and each chunk's BLAKE3, as a build's blob) and recorded through
the engine-lifecycle gateway (`db.engines.insert_imported`), UNPROVEN, with its provenance (who, from
where, the declaration, the header's facts) and its `engine.import` audit row in one transaction.

An UNPROVEN engine is never returned by a lookup or selected by `pull` unless pinned; a test-load
that passes on a host that can run it makes it READY (`service.builds.testload`). Its cache key has
a build's ingredients where they are known and `core.cachekey.UNKNOWN` where they are not (the
optimization level and workspace, which a file does not say; the profiles, the library version and
the OS unless declared or proven; a conversion's recipe for any precision but fp32), so it never
equals a key a build computes. Importing bytes the catalog holds already with the same declaration
answers that engine (`already`); with another declaration it is refused.

A folder is imported as an engine bundle by `service.engines.bundles` (every rank engine's header
checked as one file's is, the engine's blob the bundle's manifest), which uses this module's checks.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.base import Backend
from enginecache.core.backends.headerfacts import (
    HeaderFacts,
    declared_target_info,
    declared_targets,
    read_header_facts,
)
from enginecache.core.backends.registry import get_backend
from enginecache.core.cachekey import KEY_SCHEMA, UNKNOWN, compute_cache_key, unknown_fields
from enginecache.core.hashing import HEAD_BYTES, head_digest
from enginecache.core.precision import PRECISIONS, PrecisionSpec, plan_recipe
from enginecache.core.profiles import parse_profile_args, resolve_profile
from enginecache.core.store import BlobInfo
from enginecache.db import engines
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord, utcnow
from enginecache.errors import BadInputError, ImportRefusedError, PrecisionError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.models.register import get_model, model_inputs

logger = logging.getLogger(__name__)

MAX_NOTES_CHARS = 2000


@dataclass(frozen=True)
class ImportRequest:
    """What `engine import` declares about the file at `path`."""

    path: Path
    model: str  # a model reference as `get_model` reads it: NAME, NAME@vN, NAME@ALIAS, an id or a digest
    backend: str
    precision: str
    targets: tuple[str, ...] = ()  # () where the header proves them
    backend_version: str | None = None
    profiles: tuple[str, ...] = ()  # `--profile` values, as `build` takes them
    notes: str = ""
    source: str | None = None  # where the file came from, as recorded (default: this host and the path)


@dataclass(frozen=True)
class ImportResult:
    """The engine the import recorded (or found: `already`), with what was proven and what is unknown."""

    engine_id: int
    status: str
    model: str
    model_id: int
    backend: str
    precision: str
    targets: tuple[str, ...]
    backend_version: str
    sha256: str
    size_bytes: int
    cache_key: str
    provenance: dict[str, Any] = field(default_factory=dict)
    already: bool = False

    @property
    def unknown(self) -> list[str]:
        return list(self.provenance.get("unknown") or [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.engine_id,
            "status": self.status,
            "model": self.model,
            "model_id": self.model_id,
            "backend": self.backend,
            "precision": self.precision,
            "targets": list(self.targets),
            "backend_version": self.backend_version or None,
            "sha256": self.sha256,
            "size_bytes": self.size_bytes,
            "cache_key": self.cache_key,
            "already": self.already,
            "unknown": self.unknown,
            "provenance": self.provenance,
        }


def checked_declaration(app: AppContext, request: ImportRequest) -> tuple[ModelRecord, Backend, tuple[str, ...]]:
    """What an import (of a file or a bundle folder) declares, checked before anything is read: the
    notes' length, the model, the backend, the precision and the targets (BadInputError,
    PrecisionError, NotFoundError naming what is wrong)."""
    if len(request.notes) > MAX_NOTES_CHARS:
        raise BadInputError(f"--notes is {len(request.notes)} characters; at most {MAX_NOTES_CHARS}")
    model = get_model(app, request.model)
    backend = get_backend(request.backend)
    if request.precision not in PRECISIONS:
        raise PrecisionError(f"unknown precision {request.precision!r}; choose one of {', '.join(PRECISIONS)}")
    return model, backend, declared_targets(backend, tuple(request.targets))


def import_engine(app: AppContext, request: ImportRequest) -> ImportResult:
    """Check, store and record the engine file `request.path` (module docstring). Raises
    ImportRefusedError (a header that contradicts the declaration, bytes that are no engine of the
    backend, bytes the catalog holds under another declaration), BadInputError (no such file, an
    unknown backend, precision, target or profile, a model reference that names none), AccessDeniedError
    (an actor below the operator role); nothing is stored or recorded then."""
    access.require(app, "import")
    path = Path(request.path)
    if not path.is_file():
        raise BadInputError(f"engine file {path} does not exist (or is not a file)")
    model, backend, declared = checked_declaration(app, request)
    with open(path, "rb") as stream:
        header = stream.read(HEAD_BYTES)
    if not header:
        raise ImportRefusedError(f"{path} is empty: not a {backend.label} engine")
    facts = read_header_facts(backend, header)
    if facts.refusal is not None:
        raise ImportRefusedError(f"{path} is refused: {facts.refusal}")
    targets = _targets(backend, path, declared, facts)
    backend_version = _backend_version(backend, path, request.backend_version, facts)
    profile = (
        resolve_profile(model_inputs(model), parse_profile_args(request.profiles)).to_dict()
        if request.profiles
        else None
    )

    blob = app.store.ingest_file(path)
    if blob.head_blake3 and blob.head_blake3 != head_digest(header):
        raise ImportRefusedError(f"{path} changed while it was imported (its first bytes are not those checked)")
    return record_import(app, request, model, backend, declared, facts, targets, backend_version, profile, blob)


def record_import(
    app: AppContext,
    request: ImportRequest,
    model: ModelRecord,
    backend: Any,
    declared: tuple[str, ...],
    facts: HeaderFacts,
    targets: tuple[str, ...],
    backend_version: str | None,
    profile: dict[str, Any] | None,
    blob: BlobInfo,
    bundle: dict[str, Any] | None = None,
) -> ImportResult:
    """Record the stored `blob` as an UNPROVEN import (or answer the engine that holds its bytes
    already); `bundle` (an engine bundle's summary) goes into its provenance."""
    path = Path(request.path)
    ingredients = _ingredients(model, backend, request.precision, targets, backend_version, profile)
    cache_key = compute_cache_key(ingredients)
    found = _same_bytes(app, blob.sha256)
    if found is not None:
        return _already(app, found, model, backend.name, request.precision, targets)

    actor = audit.current_actor()
    now = utcnow()
    unknown = unknown_fields(ingredients)
    provenance: dict[str, Any] = {
        "kind": "imported",
        "by": actor.name,
        "origin": actor.origin,
        "source": request.source or f"{socket.gethostname()}:{os.path.abspath(path)}",
        "at": now.isoformat(),
        "declared": {
            "backend": backend.name,
            "targets": list(declared) or None,
            "precision": request.precision,
            "backend_version": request.backend_version,
            "profiles": list(request.profiles) or None,
            "notes": request.notes or None,
        },
        "header": facts.to_dict(),
        "unknown": unknown,
    }
    if bundle is not None:
        provenance["bundle"] = bundle
    row = {
        "model_id": model.id,
        "backend": backend.name,
        "backend_version": backend_version or "",
        "precision": request.precision,
        "targets": ",".join(targets),
        "cache_key": cache_key,
        "onnx_digest": model.digest,
        "key_ingredients": ingredients,
        "precision_recipe": ingredients["precision"],
        "build_options": {"profiles": profile or {}},
        "target_info": {k: v for k, v in ingredients["target"].items() if v != UNKNOWN},
        "os": "" if ingredients["os"] == UNKNOWN else ingredients["os"],
        "host": {},
        "io": _model_io(model),
        "warnings": [*facts.notes, *(f"unknown: {name}" for name in unknown)],
        "sha256": blob.sha256,
        "blake3": blob.blake3,
        "header_blake3": blob.head_blake3 or None,
        "chunk_blake3": blob.chunk_blake3 or None,
        "size_bytes": blob.size,
        "blob_path": app.store.relative(blob.path),
        "builder_log": f"imported from {provenance['source']} by {actor.name}",
        "created_at": now,
        "finished_at": now,
        "verified_at": now,
        "provenance": provenance,
    }
    details = {
        "model_id": model.id,
        "backend": backend.name,
        "precision": request.precision,
        "targets": ",".join(targets),
        "sha256": blob.sha256,
        "source": provenance["source"],
        "declared": provenance["declared"],
        "proven": {"targets": facts.to_dict()["targets"], "backend_version": facts.backend_version},
    }
    with app.catalog.changes() as ex:
        engine_id = engines.insert_imported(ex, row, actor=actor, details=details)
    _sign_where_a_pool_key_is_set(app, engine_id)
    logger.info("engine %s imported from %s: UNPROVEN (%s)", engine_id, provenance["source"], ", ".join(targets))
    return ImportResult(
        engine_id=engine_id,
        status=EngineStatus.UNPROVEN.value,
        model=model.name,
        model_id=model.id or 0,
        backend=backend.name,
        precision=request.precision,
        targets=targets,
        backend_version=backend_version or "",
        sha256=blob.sha256,
        size_bytes=blob.size,
        cache_key=cache_key,
        provenance=provenance,
    )


def _targets(backend: Any, path: Path, declared: tuple[str, ...], facts: HeaderFacts) -> tuple[str, ...]:
    proven = facts.targets
    if proven is not None and declared and set(declared) != set(proven):
        raise ImportRefusedError(
            f"{path}'s header says it was built for {backend.show_targets(proven) or 'no known target'}; "
            f"the import declares --target {backend.show_targets(declared)}"
        )
    targets = declared or proven or ()
    if not targets:
        raise BadInputError(f"name the engine's targets with --target: the header of {path} does not say them")
    return tuple(targets)


def _backend_version(backend: Any, path: Path, declared: str | None, facts: HeaderFacts) -> str | None:
    proven = facts.backend_version
    if declared is not None and not declared.strip():
        raise BadInputError("--backend-version is empty")
    if declared and proven and declared != proven and not declared.startswith(proven + "."):
        raise ImportRefusedError(
            f"{path}'s header says {backend.label} {proven} wrote it; the import declares --backend-version {declared}"
        )
    return declared or proven


def _ingredients(
    model: ModelRecord,
    backend: Any,
    precision: str,
    targets: tuple[str, ...],
    backend_version: str | None,
    profile: dict[str, Any] | None,
) -> dict[str, Any]:
    """A build's ingredients (`service.builds.plan.plan_build`) where the import knows them, UNKNOWN
    where it does not (module docstring)."""
    recipe: dict[str, Any] = (
        plan_recipe(PrecisionSpec("fp32")) if precision == "fp32" else {"name": precision, "conversion": UNKNOWN}
    )
    return {
        "schema": KEY_SCHEMA,
        "onnx_digest": model.digest,
        "precision": recipe,
        "build_options": {
            "profiles": profile if profile is not None else UNKNOWN,
            "opt_level": UNKNOWN,
            "workspace_bytes": UNKNOWN,
            "strongly_typed": UNKNOWN,
        },
        "backend": backend.name,
        "backend_version": backend_version or UNKNOWN,
        "target": declared_target_info(backend, targets),
        "os": UNKNOWN,
    }


def _model_io(model: ModelRecord) -> list[dict[str, Any]]:
    """The inputs and outputs of the model the engine was declared to be built from, as its
    registration recorded them (what a test-load feeds it); an engine's own IO is read by the load."""
    tensors = []
    for mode in ("inputs", "outputs"):
        for t in model.info.get(mode, []):
            tensors.append({"name": t["name"], "mode": mode[:-1], "dtype": t["dtype"], "shape": list(t["shape"])})
    return tensors


def _same_bytes(app: AppContext, sha256: str) -> EngineRecord | None:
    query = (
        select(EngineRecord)
        .where(
            EngineRecord.sha256 == sha256,
            col(EngineRecord.status).not_in((EngineStatus.RETIRED, EngineStatus.FAILED)),
        )
        .order_by(col(EngineRecord.id))
    )
    with app.catalog.read() as session:
        return session.exec(query).first()


def _already(
    app: AppContext, found: EngineRecord, model: ModelRecord, backend: str, precision: str, targets: tuple[str, ...]
) -> ImportResult:
    same = (found.model_id, found.backend, found.precision, found.targets) == (
        model.id,
        backend,
        precision,
        ",".join(targets),
    )
    if not same:
        raise ImportRefusedError(
            f"these bytes are engine {found.id} already (model id {found.model_id}, {found.backend} "
            f"{found.precision} {found.targets}), not what this import declares"
        )
    return ImportResult(
        engine_id=found.id or 0,
        status=str(found.status),
        model=model.name,
        model_id=model.id or 0,
        backend=found.backend,
        precision=found.precision,
        targets=targets,
        backend_version=found.backend_version,
        sha256=found.sha256 or "",
        size_bytes=found.size_bytes or 0,
        cache_key=found.cache_key,
        provenance=dict(found.provenance or {"kind": "built"}),
        already=True,
    )


def _sign_where_a_pool_key_is_set(app: AppContext, engine_id: int) -> None:
    """Where this process holds a pool's signing key (`ENGINECACHE_SIGNING_KEY`), the import is
    signed at once, its statement naming the importer and the source (audited `engine.signed`, by
    `engine import`): the bytes were hashed by this import a moment ago. Without a key it stays
    unsigned until an admin's `verify --sign`."""
    from enginecache.core.signing import policy, signing_key
    from enginecache.service.engines.signatures import sign_row

    key = signing_key()
    if key is not None:
        with app.catalog.read() as session:
            engine = session.get(EngineRecord, engine_id)
        assert engine is not None, "inserted a moment ago"
        outcome = sign_row(app, engine, key, policy(), by="engine import")
        logger.info("engine %s: %s", engine_id, outcome.message)
