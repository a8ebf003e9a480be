"""Use case: plan a build (resolve everything that decides reuse, compute the cache key), then
return the cached engine or run the build and record it.

A build request names a model, backend, targets, precision, profiles and options. Planning
validates all of it (bad input raises before anything is stored) and derives the cache key;
running converts the precision (the converted ONNX is stored as a model of its own, linked to
its source), builds with the backend into a scratch file, publishes the blob, then flips the
engine row PENDING -> READY. A failure leaves only a FAILED row with the backend's message.

A converter or a backend reads the model bundle (`models/<digest>/`, the path the digest implies)
only as `service.models.verify.stage_bundle` puts it in the build's own work folder, so what is built
from is exactly the bytes that hashed to the digest. For the backend each stored file is hard-linked
there and hashed under a read lease the build holds until the backend has read it: no copy of a
multi-GB model per build, and a file opened for writing meanwhile breaks its lease and fails the
build, naming it. A converter reads a copy made in the pass that hashes it (it loads the model with
onnx, which refuses external data of several hard links), as does a backend where no lease or link
can be had (another owner or filesystem). A bundle that no longer hashes to its digest marks the
model CORRUPT and fails the build, naming the model and digest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select
from sqlmodel.sql.expression import SelectOfScalar

from enginecache.core.backends.base import Backend, BuildSpec, LoadSpec, LogCallback, ProgressCallback
from enginecache.core.backends.registry import get_backend
from enginecache.core.cachekey import KEY_SCHEMA, compute_cache_key
from enginecache.core.calibration import load_calibration, read_model_inputs
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.hashing import hash_durable
from enginecache.core.precision import PrecisionSpec, plan_recipe
from enginecache.core.profiles import ProfileResult, parse_profile_args, resolve_profile
from enginecache.core.signing import SigningKey, engine_statement, signing_key, statement_text
from enginecache.core.store import BlobInfo
from enginecache.db import engines, queue
from enginecache.db.models import EngineRecord, EngineStatus, ModelRecord, utcnow
from enginecache.db.sqlexec import AlchemyExecutor
from enginecache.errors import (
    BackendUnavailableError,
    BuildFailedError,
    BuildOptionError,
    EngineCacheError,
    LoadFailedError,
    StaleLeaseError,
    TargetError,
)
from enginecache.service.access import audit
from enginecache.service.builds.precisionvariant import precision_variant
from enginecache.service.builds.quantizedsource import refuse_unbuildable_quantized
from enginecache.service.builds.stagedengine import BuiltEngine, EngineStaging
from enginecache.service.context import AppContext
from enginecache.service.jobs.routing import WORKER_ALIVE_SECONDS, can_run, requirement_words
from enginecache.service.models.register import get_model, model_inputs, model_path

logger = logging.getLogger(__name__)

OPT_LEVELS = range(0, 6)


@dataclass(frozen=True)
class BuildRequest:
    model: str
    backend: str = "rtx"
    targets: tuple[str, ...] = ()
    precision: str = "fp32"
    profiles: tuple[str, ...] = ()
    calibration: Path | None = None
    converter: str | None = None
    opt_level: int | None = None
    workspace_bytes: int | None = None


@dataclass(frozen=True)
class BuildPlan:
    model: ModelRecord
    backend: Backend
    backend_version: str
    targets: tuple[str, ...]
    profile: ProfileResult
    precision: PrecisionSpec
    recipe: dict[str, Any]
    build_options: dict[str, Any]
    target_info: dict[str, Any]
    ingredients: dict[str, Any]
    cache_key: str
    host: HostFingerprint
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class BuildResult:
    engine: EngineRecord
    model: ModelRecord
    cache_hit: bool
    notes: tuple[str, ...] = field(default_factory=tuple)


def plan_build(app: AppContext, request: BuildRequest, *, host: HostFingerprint | None = None) -> BuildPlan:
    """Validate a request and compute its cache key; raises a EngineCacheError subclass on bad input."""
    backend = get_backend(request.backend)
    host = host or host_fingerprint()
    model = get_model(app, request.model)
    refuse_unbuildable_quantized(app, model, backend)  # before the spec's advice: fp32 as is, where it builds
    precision = PrecisionSpec(
        request.precision,
        calibration=request.calibration,
        converter=request.converter,
        backend_family=backend.precision_family,
        source_quantized=model.info.get("quantized"),
    )
    try:
        backend_version = backend.version()
    except BackendUnavailableError as err:
        needs = _worker_needs(backend, tuple(request.targets), err)
        if needs is None:
            raise
        host, backend_version = _worker_host(app, backend, needs, err)
    targets = backend.resolve_targets(tuple(request.targets), host)
    profile = resolve_profile(model_inputs(model), parse_profile_args(request.profiles))
    if request.opt_level is not None and request.opt_level not in OPT_LEVELS:
        raise BuildOptionError(f"optimization level {request.opt_level} is out of range 0..5")
    if request.workspace_bytes is not None and request.workspace_bytes <= 0:
        raise BuildOptionError(f"workspace must be a positive number of bytes, got {request.workspace_bytes}")
    if request.calibration is not None:
        load_calibration(request.calibration, read_model_inputs(model_path(app, model)))
    recipe = plan_recipe(precision, input_shapes=profile.opt_shapes())
    build_options = {
        "profiles": profile.to_dict(),
        "opt_level": request.opt_level,
        "workspace_bytes": request.workspace_bytes,
        "strongly_typed": True,
    }
    target_info = backend.target_info(targets, host)
    ingredients = {
        "schema": KEY_SCHEMA,
        "onnx_digest": model.digest,
        "precision": recipe,
        "build_options": build_options,
        "backend": backend.name,
        "backend_version": backend_version,
        "target": target_info,
        "os": host.os,
    }
    return BuildPlan(
        model=model,
        backend=backend,
        backend_version=backend_version,
        targets=targets,
        profile=profile,
        precision=precision,
        recipe=recipe,
        build_options=build_options,
        target_info=target_info,
        ingredients=ingredients,
        cache_key=compute_cache_key(ingredients),
        host=host,
        notes=tuple(profile.describe_defaults()),
    )


def _worker_needs(
    backend: Backend, requested: tuple[str, ...], missing: BackendUnavailableError
) -> dict[str, Any] | None:
    """What a live worker must have to build `requested` where the library is missing here (the
    backend's answer), or None: then the build is planned only where the library is installed."""
    try:
        return backend.worker_build_requirements(requested)
    except TargetError as err:
        raise TargetError(f"{missing}; {err}") from err


def _worker_host(
    app: AppContext, backend: Backend, needs: dict[str, Any], missing: BackendUnavailableError
) -> tuple[HostFingerprint, str]:
    """A backend that builds on the hardware it is for (TensorRT tunes on its GPU) is planned from a
    host without its library (a CPU dashboard host) for the live worker that has the library and the
    hardware asked for: that worker's library version and GPU go into the key, and the job is routed
    to workers that match them."""
    since = utcnow() - timedelta(seconds=WORKER_ALIVE_SECONDS)
    for worker in queue.list_workers(app.catalog, alive_since=since):
        version = (worker.capabilities.get("versions") or {}).get(backend.name)
        if version and can_run(needs, worker.capabilities):
            return HostFingerprint.from_dict(worker.fingerprint), str(version)
    raise TargetError(
        f"{missing}; and no live worker has {requirement_words(needs)} to build it "
        "(start `enginecache worker` on such a host)"
    )


_READY_BY_KEY = (
    select(EngineRecord)
    .where(col(EngineRecord.cache_key) == sa.bindparam("cache_key"), col(EngineRecord.status) == EngineStatus.READY)
    .order_by(col(EngineRecord.id))
    .limit(1)
)


def ready_engine_query() -> SelectOfScalar[EngineRecord]:
    """The statement `find_ready_engine` runs (bind `cache_key`): one probe of ix_engines_key_status
    (cache_key, status). Built once: SQLAlchemy then reuses its cache key and compiled form, which
    halves a lookup's cost against building the statement per call."""
    return _READY_BY_KEY


def find_ready_engine(app: AppContext, cache_key: str) -> EngineRecord | None:
    """The READY engine with this cache key (the oldest where several are), else None."""
    with app.catalog.read() as session:
        return session.exec(_READY_BY_KEY, params={"cache_key": cache_key}).first()


def build_engine(
    app: AppContext,
    request: BuildRequest,
    *,
    progress: ProgressCallback | None = None,
    host: HostFingerprint | None = None,
) -> BuildResult:
    """Return the READY engine for this request's cache key, or build and record it."""
    plan = plan_build(app, request, host=host)
    existing = find_ready_engine(app, plan.cache_key)
    if existing is not None:
        return BuildResult(existing, plan.model, cache_hit=True, notes=plan.notes)
    built = run_build(app, plan, progress=progress)
    engine = built.engine
    details = {"model_id": plan.model.id, "backend": engine.backend, "precision": engine.precision}
    audit.record(app, audit.BUILD_RUN, f"engine {engine.id}", {**details, "targets": engine.targets})
    return built


def create_pending_engine(
    app: AppContext, plan: BuildPlan, *, job_id: int | None = None, job_attempt: int | None = None
) -> EngineRecord:
    record = EngineRecord(
        job_id=job_id,
        job_attempt=job_attempt,
        model_id=plan.model.id or 0,
        backend=plan.backend.name,
        backend_version=plan.backend_version,
        precision=plan.precision.precision,
        targets=",".join(plan.targets),
        cache_key=plan.cache_key,  # status: PENDING, the column's default
        onnx_digest=plan.model.digest,
        key_ingredients=plan.ingredients,
        precision_recipe=plan.recipe,
        build_options=plan.build_options,
        target_info=plan.target_info,
        os=plan.ingredients["os"],
        host=plan.host.to_dict(),
    )
    with app.catalog.write() as session:
        session.add(record)
    return record


Finalizer = Callable[[int, Callable[[Session], None]], None]


def run_build(
    app: AppContext,
    plan: BuildPlan,
    *,
    progress: ProgressCallback | None = None,
    log: LogCallback | None = None,
    job_id: int | None = None,
    job_attempt: int | None = None,
    finalize: Finalizer | None = None,
    before_publish: Callable[[], None] | None = None,
    staging: EngineStaging | None = None,
) -> BuildResult:
    """Run a planned build: PENDING row, precision variant, backend build, blob, READY row.

    `finalize(engine_id, mutate)` runs the READY transition in a transaction of the caller's
    choosing (a queue job passes one that first checks its lease token); by default a plain write.
    `before_publish()` runs after the build and before the blob goes to the store (and its remote):
    a queue job checks its lease there, so a host whose job was taken over publishes nothing.
    `staging` (a build job's, service.builds.stagedengine): the engine is kept there once built and
    proven loadable, hashed once, and published from there; an engine an earlier attempt staged for
    this cache key, found whole by its hash, is published without building (the backend is not called).
    """
    key = signing_key()  # a pool's key that cannot be used fails the build before anything is written
    record = create_pending_engine(app, plan, job_id=job_id, job_attempt=job_attempt)
    engine_id = record.id or 0
    started = time.perf_counter()
    try:
        with app.store.temp_dir(prefix=f"build-{engine_id}-") as work:
            made = staging.take(plan.cache_key, log) if staging is not None else None
            if made is None:
                made = _build_here(app, plan, work, engine_id, started, progress, log)
                if staging is not None:
                    made = staging.keep(made, plan.cache_key)
            elif log is not None:
                log(_reuse_line(made, job_attempt))
            if before_publish is not None:
                before_publish()
            # The engine lies in this build's own work folder (or its job's staging folder), on the
            # store's filesystem: hashed where it lies and published by hard link, never copied.
            digest = made.digest if made.digest is not None else hash_durable(made.path)
            blob = app.store.publish_hashed(made.path, digest)
        seconds = made.build_seconds if made.reused else time.perf_counter() - started
    except StaleLeaseError as err:  # the fence: this host's job was taken over, nothing is published
        _mark_failed(app, engine_id, f"not published: {err}", "")
        raise
    except EngineCacheError as err:
        _mark_failed(app, engine_id, str(err), getattr(err, "log", ""))
        raise BuildFailedError(f"engine {engine_id} failed to build: {err}", engine_id) from err
    except BaseException as err:
        _mark_failed(app, engine_id, f"interrupted: {type(err).__name__}: {err}", "")
        raise
    ready: list[EngineRecord] = []
    builder_log = f"{made.log}\n{made.proof}" if made.log else made.proof
    if made.reused:
        builder_log = f"{builder_log}\n{_reuse_line(made, job_attempt)}"

    def mark_ready(session: Session) -> None:
        facts = {
            "variant_model_id": made.variant_model_id if made.variant_model_id != plan.model.id else None,
            "sha256": blob.sha256,
            "blake3": blob.blake3,
            "header_blake3": blob.head_blake3 or None,
            "chunk_blake3": blob.chunk_blake3 or None,
            "size_bytes": blob.size,
            "blob_path": app.store.relative(blob.path),
            "build_seconds": seconds,
            "builder_log": builder_log,
            "io": made.io,
            "warnings": made.warnings,
            "finished_at": utcnow(),
        }
        if key is not None:
            facts.update(_signed(plan, blob, key, job_id))
        engines.mark_ready(AlchemyExecutor(session.connection()), engine_id, facts)
        row = session.get(EngineRecord, engine_id, populate_existing=True)
        if row is None:
            raise BuildFailedError(f"engine row {engine_id} vanished", engine_id)
        ready.append(row)

    try:
        (finalize or _plain_write(app))(engine_id, mark_ready)
    except BaseException as err:
        _mark_failed(app, engine_id, f"not published: {type(err).__name__}: {err}", made.log)
        raise
    logger.info(
        "engine %s READY: %s %s %s in %.2f s%s",
        engine_id,
        plan.backend.name,
        plan.precision.precision,
        ",".join(plan.targets),
        seconds,
        " (staged by an earlier attempt)" if made.reused else "",
    )
    return BuildResult(ready[0], plan.model, cache_hit=False, notes=plan.notes)


def _build_here(
    app: AppContext,
    plan: BuildPlan,
    work: Path,
    engine_id: int,
    started: float,
    progress: ProgressCallback | None,
    log: LogCallback | None,
) -> BuiltEngine:
    """Convert the precision (a verified private copy), build with the backend into `work`, and prove
    the engine loads: the engine made here, not yet hashed."""
    # The bundle the backend reads is the stored files, linked and read under read leases (no
    # multi-GB copy): checked when the block ends, once the backend has read them.
    with ExitStack() as leases:
        variant, source, warnings = precision_variant(
            app, plan.model, plan.precision, plan.recipe, plan.profile.opt_shapes(), work, leases=leases
        )
        spec = BuildSpec(
            onnx_path=source,
            targets=plan.targets,
            profile=plan.profile,
            precision=plan.precision.precision,
            opt_level=plan.build_options["opt_level"],
            workspace_bytes=plan.build_options["workspace_bytes"],
        )
        output = plan.backend.build(spec, work / "engine.plan", progress, log)
    proof = _prove_loadable(plan, output.engine_path, engine_id)
    if log is not None:
        log(proof)
    return BuiltEngine(
        path=output.engine_path,
        log=output.log,
        proof=proof,
        io=[t.to_dict() for t in output.io],
        warnings=[*plan.notes, *warnings, *output.warnings],
        variant_model_id=variant.id,
        build_seconds=time.perf_counter() - started,
    )


def _reuse_line(made: BuiltEngine, attempt: int | None) -> str:
    """The job log's and the builder log's account of an engine published without a build."""
    job_id, built_in = made.built_by or (0, 0)
    sha256 = made.digest.sha256 if made.digest is not None else "?"
    return (
        f"[staged] not built again: attempt {attempt} publishes the engine attempt {built_in} of job {job_id} "
        f"built and staged (sha256 {sha256}, verified by its hash)"
    )


def _signed(plan: BuildPlan, blob: BlobInfo, key: SigningKey, job_id: int | None) -> dict[str, str]:
    """The engine's signed statement (core.signing) and its signature, as `mark_ready` stores them:
    its digests bound to the plan's cache key and ingredients, the model, backend, version, precision,
    targets, and who built it where."""
    origin = {"kind": "built", "by": audit.current_actor().name, "host": plan.host.hostname, "job_id": job_id}
    statement = engine_statement(
        sha256=blob.sha256,
        blake3_digest=blob.blake3,
        header_blake3=blob.head_blake3,
        chunk_blake3=blob.chunk_blake3,
        size_bytes=blob.size,
        cache_key=plan.cache_key,
        ingredients=plan.ingredients,
        model_digest=plan.model.digest,
        model_name=plan.model.name,
        backend=plan.backend.name,
        backend_version=plan.backend_version,
        precision=plan.precision.precision,
        targets=plan.targets,
        origin=origin,
        key=key.key_id,
        signed_at=utcnow().isoformat(timespec="seconds"),
    )
    text = statement_text(statement)
    return {"signed_statement": text, "signature": key.sign(text)}


def _prove_loadable(plan: BuildPlan, engine_path: Path, engine_id: int) -> str:
    """The backend's proof that the engine it wrote loads on this host, where that can be proven;
    an engine that does not load fails its build with the runtime's words (never READY)."""
    spec = LoadSpec(
        input_shapes=plan.profile.opt_shapes(),
        label=f"engine {engine_id}",
        backend_version=plan.backend_version,
        targets=plan.targets,
    )
    try:
        return plan.backend.prove_loadable(engine_path, spec, plan.host)
    except LoadFailedError as err:
        built = f"{plan.backend.label} built it, but it does not load on the building host"
        raise LoadFailedError(f"{built}: {err}") from err


def _plain_write(app: AppContext) -> Finalizer:
    def run(_engine_id: int, mutate: Callable[[Session], None]) -> None:
        with app.catalog.write() as session:
            mutate(session)

    return run


def _mark_failed(app: AppContext, engine_id: int, error: str, log: str) -> None:
    with app.catalog.changes() as ex:
        engines.mark_failed(ex, engine_id, error, at=utcnow(), builder_log=log)
