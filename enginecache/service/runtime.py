"""`load_or_build()` for serving processes: the engine for this model, spec and host, loaded, in
milliseconds on a cache hit.

It lives in `service` (not `core.runtime` as DESIGN.md sketches) because it needs the catalog, and
the layering DESIGN.md sets forbids `core` from importing `db`. The catalog-free parts are in core:
reading and verifying the blob (`core.hashing.read_verified`), sessions (`core.backends.*.session`), backends'
`load`.

On a hit the only work that grows with size is reading the engine once:
- the ONNX digest comes from a stat cache in the catalog keyed by (host, path) and checked against
  (size, mtime_ns, ctime_ns, inode) of the model and of each external data file, so a multi-GB model
  is not re-hashed; a changed file is re-hashed, never trusted;
- the engine blob is verified (BLAKE3 when recorded, else sha256) in the same pass that reads it
  into the buffer handed to the runtime.

Every call records a load event (hit | miss | built | rejected | failed) with seconds per phase.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np
import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.backends.base import EngineSession, LoadSpec, PhaseTimer
from enginecache.core.backends.registry import get_backend
from enginecache.core.cachekey import FieldDiff, diff_ingredients
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.hashing import read_verified
from enginecache.core.onnx_info import inspect_model
from enginecache.db.models import EngineRecord, EngineStatus, LoadEventRecord, ModelRecord, StatCacheRecord, utcnow
from enginecache.errors import (
    EngineCacheError,
    EngineQueuedError,
    EngineRejectedError,
    IncompatibleEngineError,
    IntegrityCheckError,
    LoadFailedError,
    MissError,
)
from enginecache.service.builds import BuildPlan, BuildRequest, build_engine, find_ready_engine, plan_build
from enginecache.service.context import AppContext
from enginecache.service.events import record_event
from enginecache.service.jobs import submit_build
from enginecache.service.models import find_model_by_digest, get_model, register_model
from enginecache.service.testload import host_target

logger = logging.getLogger(__name__)

OnMiss = Literal["build", "fail", "queue"]
# Filesystems with coarse timestamps: a file modified within this long after it was hashed could
# keep the same mtime, so such an entry is "racy" (git's term) and re-hashed on the next lookup.
RACY_WINDOW_NS = 2_000_000_000


@dataclass(frozen=True)
class RuntimeSpec:
    """Which engine to serve: the build request less the model (the model is the ONNX file)."""

    backend: str = "rtx"
    precision: str = "fp32"
    targets: tuple[str, ...] = ()
    profiles: tuple[str, ...] = ()
    calibration: Path | None = None
    converter: str | None = None
    opt_level: int | None = None
    workspace_bytes: int | None = None

    def request(self, model: str) -> BuildRequest:
        return BuildRequest(model=model, **asdict(self))


@dataclass
class LoadedEngine:
    """A loaded engine session with what load_or_build did to get it."""

    session: EngineSession
    engine: EngineRecord
    outcome: str  # "hit" | "built"
    phases: dict[str, float] = field(default_factory=dict)
    onnx_digest: str = ""

    def infer(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.session.infer(feeds)

    @property
    def raw(self) -> Any:
        """The backend's own objects: ORT's InferenceSession, or TensorRT's (engine, context)."""
        if hasattr(self.session, "context"):
            return (getattr(self.session, "engine", None), self.session.context)
        return getattr(self.session, "raw", None)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> LoadedEngine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


@functools.lru_cache(maxsize=1)
def _local_host() -> HostFingerprint:
    return host_fingerprint()


_APPS: dict[tuple[str | None, str | None], AppContext] = {}


def _app_for(home: str | Path | None, db_url: str | None) -> AppContext:
    """One context per (home, db_url) per process: the catalog is opened (and migrated) once."""
    key = (str(home) if home is not None else None, db_url)
    if key not in _APPS:
        _APPS[key] = AppContext.from_settings(home, db_url)
    return _APPS[key]


# -- the stat cache --------------------------------------------------------------------------


def _stat_entry(path: Path) -> list[Any]:
    st = os.stat(path)
    return [path.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


@dataclass(frozen=True)
class DigestLookup:
    digest: str
    stat_cache_hit: bool
    seconds: float


def onnx_digest(app: AppContext, onnx_path: Path, *, host: HostFingerprint | None = None) -> DigestLookup:
    """The model digest (model plus external data) from the stat cache, or hashed and cached.

    Trusted only when the model file and every external data file it had still show the same
    size, mtime_ns, ctime_ns and inode, and the entry is not racy; otherwise re-hashed.
    """
    started = time.perf_counter()
    path = Path(onnx_path).absolute()
    hostname = (host or _local_host()).hostname
    try:
        model_stat = _stat_entry(path)
    except OSError as err:
        raise EngineCacheError(f"cannot read ONNX model {path}: {err}") from err
    with app.catalog.read() as session:
        row = session.exec(
            select(StatCacheRecord).where(StatCacheRecord.hostname == hostname, StatCacheRecord.path == str(path))
        ).first()
    if row is not None and not row.racy and row.files and row.files[0] == model_stat:
        current = [model_stat]
        try:
            current += [_stat_entry(path.parent / entry[0]) for entry in row.files[1:]]
        except OSError:
            current = []
        if current == row.files:
            return DigestLookup(row.digest, True, time.perf_counter() - started)
    hash_started_ns = time.time_ns()
    info = inspect_model(path)  # hashes the model and its external data in one defined order
    files = [_stat_entry(path)] + [_stat_entry(path.parent / name) for name in info.external_data_files]
    if files[0] != model_stat:
        # Changed while we hashed: the digest may mix versions; use it, cache nothing.
        logger.warning("%s changed while it was hashed; not caching its digest", path)
        return DigestLookup(info.digest, False, time.perf_counter() - started)
    racy = any(hash_started_ns - int(entry[2]) < RACY_WINDOW_NS for entry in files)
    _store_stat(app, hostname, path, files, info.digest, racy)
    return DigestLookup(info.digest, False, time.perf_counter() - started)


def _store_stat(app: AppContext, hostname: str, path: Path, files: list[list[Any]], digest: str, racy: bool) -> None:
    try:
        with app.catalog.write() as session:
            row = session.exec(
                select(StatCacheRecord).where(StatCacheRecord.hostname == hostname, StatCacheRecord.path == str(path))
            ).first()
            row = row or StatCacheRecord(
                hostname=hostname, path=str(path), size_bytes=0, mtime_ns=0, inode=0, digest=""
            )
            row.size_bytes, row.mtime_ns, row.inode = int(files[0][1]), int(files[0][2]), int(files[0][4])
            row.files, row.digest, row.racy, row.hashed_at = files, digest, racy, utcnow()
            session.add(row)
    except sa.exc.IntegrityError:
        logger.debug("stat cache entry for %s written concurrently", path)


# -- finding the engine ----------------------------------------------------------------------


def _covers_host(engine: EngineRecord, host: HostFingerprint) -> bool:
    targets = set(engine.targets.split(","))
    if engine.backend == "ort":
        return host.cpu_target in targets
    return any(g.compute_capability in targets for g in host.gpus)


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
    """The READY engine with the plan's cache key, or one whose key differs only in its target list
    and whose targets include this host's GPU (a TensorRT-RTX engine built for several SMs)."""
    exact = find_ready_engine(app, plan.cache_key)
    if exact is not None and ((plan.backend.name == "rtx" and not host.gpus) or _covers_host(exact, host)):
        return exact
    wanted = _target_free(plan.ingredients)
    for engine in _engines_of_model(app, plan.model.id or 0):
        if _target_free(engine.key_ingredients) == wanted and _covers_host(engine, host):
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
    where = host_target(plan.backend.name, host)
    return (
        f"{plan.backend.name} {plan.precision.precision} for {where.upper() if plan.backend.name != 'ort' else where}"
    )


def _show_targets(engine: EngineRecord) -> str:
    return engine.targets if engine.backend == "ort" else engine.targets.upper()


def explain_miss(app: AppContext, plan: BuildPlan, host: HostFingerprint) -> MissError:
    """'no engine for rtx fp16 for SM86; nearest: engine 4 (rtx fp16 sm89) built 2 days ago; differing fields: ...'."""
    candidates = _engines_of_model(app, plan.model.id or 0)
    head = f"no engine for {plan.model.name} {_wanted(plan, host)}"
    if not candidates:
        return MissError(f"{head}; the model has no READY engine at all")
    scored = [(diff_ingredients(e.key_ingredients, plan.ingredients), e) for e in candidates]
    diffs, nearest = min(scored, key=lambda pair: (len(pair[0]), -(pair[1].id or 0)))
    if not diffs and not _covers_host(nearest, host):
        diffs = [FieldDiff("target (host)", nearest.targets, host_target(nearest.backend, host))]
    shown = "; ".join(f"{d.field}: {d.left!r} -> {d.right!r}" for d in diffs[:6])
    summary = {
        "id": nearest.id,
        "backend": nearest.backend,
        "precision": nearest.precision,
        "targets": nearest.targets,
        "created_at": nearest.created_at.isoformat(),
    }
    return MissError(
        f"{head}; nearest: engine {nearest.id} ({nearest.backend} {nearest.precision} {_show_targets(nearest)}) "
        f"built {_age(nearest.created_at)}; differing fields: {shown}",
        nearest=summary,
        diffs=diffs,
    )


# -- load_or_build ---------------------------------------------------------------------------


def load_engine_record(app: AppContext, engine: EngineRecord, timer: PhaseTimer) -> EngineSession:
    """Read and verify the engine's blob in one pass, then load it; CORRUPT marks the engine.

    Raises EngineRejectedError (CORRUPT, INCOMPATIBLE or ERROR).
    """
    label = f"engine {engine.id}"
    path = app.home / (engine.blob_path or "")
    try:
        with timer.phase("read_verify"):
            if engine.blake3:
                buffer = read_verified(path, blake3_digest=engine.blake3)
            else:
                buffer = read_verified(path, sha256=engine.sha256 or "")
    except (IntegrityCheckError, OSError) as err:
        _mark_corrupt(app, engine.id or 0)
        raise EngineRejectedError(
            f"{label} is CORRUPT and was refused (now marked CORRUPT): {err}",
            engine_id=engine.id or 0,
            verdict="CORRUPT",
        ) from err
    profiles = engine.build_options.get("profiles", {})
    spec = LoadSpec(
        input_shapes={name: tuple(p["opt"]) for name, p in profiles.items()},
        label=label,
        backend_version=engine.backend_version,
        targets=tuple(engine.targets.split(",")),
    )
    try:
        return get_backend(engine.backend).load(buffer, spec, timer)
    except IncompatibleEngineError as err:
        raise EngineRejectedError(
            str(err), engine_id=engine.id or 0, verdict="INCOMPATIBLE", details=err.details
        ) from err
    except LoadFailedError as err:
        raise EngineRejectedError(str(err), engine_id=engine.id or 0, verdict="ERROR") from err


def _mark_corrupt(app: AppContext, engine_id: int) -> None:
    with app.catalog.write() as session:
        row = session.get(EngineRecord, engine_id)
        if row is not None:
            row.status = EngineStatus.CORRUPT
            session.add(row)


def load_or_build(
    onnx_path: str | Path,
    *,
    spec: RuntimeSpec | None = None,
    home: str | Path | None = None,
    db_url: str | None = None,
    on_miss: OnMiss = "build",
    app: AppContext | None = None,
    host: HostFingerprint | None = None,
) -> LoadedEngine:
    """The loaded engine for this ONNX file, spec and host; on a miss build it, fail or queue a build.

    Raises MissError (on_miss="fail"; the nearest engine and the differing fields in it),
    EngineQueuedError (on_miss="queue", with the job id), EngineRejectedError (the cached engine is
    CORRUPT or INCOMPATIBLE here), or a EngineCacheError for a bad spec.
    """
    if on_miss not in ("build", "fail", "queue"):
        raise EngineCacheError(f"on_miss must be build, fail or queue, not {on_miss!r}")
    spec = spec or RuntimeSpec()
    app = app or _app_for(home, db_url)
    host = host or _local_host()
    path = Path(onnx_path)
    started = time.perf_counter()
    timer = PhaseTimer()
    event = LoadEventRecord(
        hostname=host.hostname,
        model_name=path.stem,
        backend=spec.backend,
        precision=spec.precision,
        host_target=host_target(spec.backend, host),
        outcome="miss",
    )

    recorded: list[str] = []

    def finish(outcome: str, reason: str, engine: EngineRecord | None = None) -> None:
        event.outcome, event.reason = outcome, reason
        event.engine_id = engine.id if engine is not None else event.engine_id
        event.phases = dict(timer.phases)
        event.lookup_s = timer.phases.get("lookup")
        event.read_verify_s = timer.phases.get("read_verify")
        event.load_s = sum(
            timer.phases.get(p, 0.0) for p in ("validity", "deserialize", "create_context", "allocate_io")
        )
        event.build_s = timer.phases.get("build")
        event.total_s = time.perf_counter() - started
        record_event(app, event)
        recorded.append(outcome)

    try:
        with timer.phase("lookup"):
            digest = onnx_digest(app, path, host=host)
            event.stat_cache_hit = digest.stat_cache_hit
            model = find_model_by_digest(app, digest.digest)
            plan = None
            engine = None
            if model is not None:
                event.model_id, event.model_name = model.id, model.name
                plan = plan_build(app, spec.request(str(model.id)), host=host)
                engine = find_engine(app, plan, host)
        if engine is not None:
            try:
                session = load_engine_record(app, engine, timer)
            except EngineRejectedError as err:
                finish("rejected", str(err), engine)
                raise
            finish("hit", f"engine {engine.id}", engine)
            return LoadedEngine(session, engine, "hit", dict(timer.phases), digest.digest)
        # -- a miss ----------------------------------------------------------------------------
        if plan is not None:
            miss = explain_miss(app, plan, host)
        else:
            miss = MissError(
                f"no model with digest {digest.digest[:16]}... ({path.name}) in the catalog" + _renamed(app, path)
            )
        if on_miss == "fail":
            finish("miss", str(miss))
            raise miss
        if model is None:
            model = register_model(app, path).model
            event.model_id, event.model_name = model.id, model.name
        request = spec.request(str(model.id))
        if on_miss == "queue":
            submitted = submit_build(app, request)
            if submitted.cache_hit and submitted.engine is not None:  # built meanwhile
                return load_or_build(path, spec=spec, on_miss="fail", app=app, host=host)
            job_id = submitted.job.id if submitted.job is not None else None
            finish("miss", f"{miss}; queued build job {job_id}")
            raise EngineQueuedError(
                f"{miss}; queued build job {job_id}", nearest=miss.nearest, diffs=miss.diffs, job_id=job_id
            )
        with timer.phase("build"):
            built = build_engine(app, request, host=host).engine
        try:
            session = load_engine_record(app, built, timer)
        except EngineRejectedError as err:
            finish("rejected", f"built engine {built.id}, then: {err}", built)
            raise
        finish("built", f"{miss}; built engine {built.id}", built)
        return LoadedEngine(session, built, "built", dict(timer.phases), digest.digest)
    except BaseException as err:
        if not recorded:  # every call leaves an event, also one that fails
            finish("failed", f"{type(err).__name__}: {err}")
        raise


def _renamed(app: AppContext, path: Path) -> str:
    """A hint when a model of the same file name is registered with other bytes (the file changed)."""
    with app.catalog.read() as session:
        same_name = session.exec(
            select(ModelRecord).where(ModelRecord.filename == path.name).order_by(col(ModelRecord.id).desc())
        ).first()
    if same_name is None:
        return ""
    return (
        f"; model {same_name.name!r} (id {same_name.id}) has the same file name with digest "
        f"{same_name.digest[:16]}...: the file's bytes changed since it was registered"
    )


# -- readiness -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadyResult:
    ready: bool
    reason: str
    engine_id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"ready": self.ready, "reason": self.reason, "engine_id": self.engine_id}


def check_ready(
    app: AppContext, model: str, spec: RuntimeSpec | None = None, *, host: HostFingerprint | None = None
) -> ReadyResult:
    """Is the engine for this model, spec and host loadable here: present, verified and compatible?"""
    spec = spec or RuntimeSpec()
    host = host or _local_host()
    record = get_model(app, model)
    plan = plan_build(app, spec.request(str(record.id)), host=host)
    engine = find_engine(app, plan, host)
    if engine is None:
        return ReadyResult(False, str(explain_miss(app, plan, host)))
    path = app.home / (engine.blob_path or "")
    try:
        if engine.blake3:
            read_verified(path, blake3_digest=engine.blake3)
        else:
            read_verified(path, sha256=engine.sha256 or "")
    except (IntegrityCheckError, OSError) as err:
        _mark_corrupt(app, engine.id or 0)
        return ReadyResult(False, f"engine {engine.id} is CORRUPT (now marked): {err}", engine.id)
    from enginecache.core.backends.base import EngineRef

    ref = EngineRef(
        engine.backend, engine.backend_version, tuple(engine.targets.split(",")), engine.precision, engine.os, path
    )
    compat = get_backend(engine.backend).check_compatibility(ref, host)
    if compat.verdict != "compatible":
        return ReadyResult(False, f"engine {engine.id} is {compat.verdict} here: {compat.reason}", engine.id)
    return ReadyResult(True, f"engine {engine.id} verified and compatible: {compat.reason}", engine.id)
