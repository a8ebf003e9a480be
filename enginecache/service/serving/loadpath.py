"""`load_or_build`'s full path, on the ORM: every case, and the reference for the cache hit.

Steps, each in its module: the model's digest from the stat cache (`service.serving.statcache`), the engine
for this host or why there is none (`service.serving.lookup`), reading, verifying and loading it
(`service.serving.loading`). A miss builds, fails or queues as asked. After a hit it remembers the answer
(`service.serving.memo`) for the stdlib cache hit of the next serving process (`service.serving.hitpath`).

Every call records a load event (hit | miss | built | rejected | failed) with seconds per phase.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from enginecache.core.backends.base import PhaseTimer
from enginecache.core.backends.registry import get_backend
from enginecache.core.diskbudget import BlobHold
from enginecache.core.fingerprint import HostFingerprint
from enginecache.db.engines import phase_seconds, ready_engine_ids
from enginecache.db.models import (
    EngineMemoRecord,
    EngineRecord,
    LoadEventRecord,
    ModelRecord,
    utcnow,
)
from enginecache.db.sqlexec import AlchemyExecutor
from enginecache.errors import EngineQueuedError, EngineRejectedError
from enginecache.service.builds.plan import BuildPlan, build_engine, plan_build
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.engines.events import record_event
from enginecache.service.models.register import find_model_by_digest, register_model
from enginecache.service.serving.loading import engine_facts, load_engine_record
from enginecache.service.serving.localhost import local_host
from enginecache.service.serving.lookup import explain_miss, find_engine, unknown_model_miss
from enginecache.service.serving.memo import memo_ingredients, memo_key, ready_list
from enginecache.service.serving.runtimetypes import LoadedEngine, OnMiss, RuntimeSpec
from enginecache.service.serving.statcache import onnx_digest

logger = logging.getLogger(__name__)

_APPS: dict[tuple[str | None, str | None], AppContext] = {}


def app_for(home: str | Path | None, db_url: str | None) -> AppContext:
    """One context per (home, db_url) per process: the catalog is opened (and migrated) once."""
    key = (str(home) if home is not None else None, db_url)
    if key not in _APPS:
        _APPS[key] = AppContext.from_settings(home, db_url)
    return _APPS[key]


def _ready_engine_ids(app: AppContext, model_id: int) -> list[int]:
    with app.catalog.read() as session:
        return ready_engine_ids(AlchemyExecutor(session.connection()), model_id)


MEMOS_PER_MODEL_AND_HOST = 32  # a deploy (new code) or spec adds one; older ones are pruned


def _prune_memos(session: Session, kept: EngineMemoRecord) -> None:
    """Keep the newest MEMOS_PER_MODEL_AND_HOST memos of this model written from this host (each
    code version, spec and backend version adds one; the old ones only take space)."""
    stale = session.exec(
        select(EngineMemoRecord)
        .where(EngineMemoRecord.model_id == kept.model_id, EngineMemoRecord.hostname == kept.hostname)
        .order_by(col(EngineMemoRecord.created_at).desc(), col(EngineMemoRecord.id).desc())
        .offset(MEMOS_PER_MODEL_AND_HOST)
    ).all()
    for memo in stale:
        if memo is not kept:
            session.delete(memo)


def remember_hit(
    app: AppContext, spec: RuntimeSpec, plan: BuildPlan, engine: EngineRecord, ready: list[int], host: HostFingerprint
) -> None:
    """Write the memo the stdlib cache hit reads: the engine `find_engine` chose for this request
    (loaded, or refused as INCOMPATIBLE or ERROR: the hit path then gives the same verdict without
    the ORM; a CORRUPT mark changes the READY set, so that memo is never served) and the model's READY
    engines when it chose it (`ready`, read before it ran, so an engine built meanwhile
    makes the memo look stale, never current). Only for a SQLite catalog (the hit path reads no
    other), a plan made for this host, and a request without a calibration file."""
    if not app.catalog.is_sqlite or spec.calibration is not None or plan.host is not host:
        return
    ingredients = memo_ingredients(plan.model.digest, spec, plan.backend, plan.backend_version, host)
    key = memo_key(ingredients)
    fields: dict[str, Any] = {
        "model_id": plan.model.id or 0,
        "engine_id": engine.id or 0,
        "cache_key": plan.cache_key,
        "ready_engines": ready_list(ready),
        "host_target": plan.backend.host_target(host),
        "hostname": host.hostname,
        "request": ingredients,
    }
    try:
        with app.catalog.read() as session:
            existing = session.exec(select(EngineMemoRecord).where(EngineMemoRecord.memo_key == key)).first()
        if existing is not None and all(getattr(existing, k) == v for k, v in fields.items() if k != "request"):
            return
        with app.catalog.write() as session:
            row = session.exec(select(EngineMemoRecord).where(EngineMemoRecord.memo_key == key)).first()
            row = row or EngineMemoRecord(memo_key=key, **fields)
            for name, value in fields.items():
                setattr(row, name, value)
            row.created_at = utcnow()
            session.add(row)
            _prune_memos(session, row)
    except sa.exc.IntegrityError:
        logger.debug("memo %s written concurrently", key[:12])
    except sa.exc.SQLAlchemyError as err:  # a memo is an optimisation: never fail a load for it
        logger.warning("load memo not written: %s", err)


def signed_request(plan: BuildPlan, engine: EngineRecord) -> dict[str, Any]:
    """What this request asks of the engine's signed statement (core.signing): the model's digest,
    every key ingredient but the target (an engine whose key differs only in its targets serves where
    the backend's rule says this host can load it), and the cache key itself where the lookup chose
    the engine by it."""
    asked: dict[str, Any] = {"model.digest": plan.model.digest, "backend": plan.backend.name}
    asked.update({f"ingredients.{name}": value for name, value in plan.ingredients.items() if name != "target"})
    if engine.cache_key == plan.cache_key:
        asked["cache_key"] = plan.cache_key
    return asked


def load_or_build_full(
    onnx_path: str | Path,
    *,
    spec: RuntimeSpec,
    home: str | Path | None = None,
    db_url: str | None = None,
    on_miss: OnMiss = "build",
    app: AppContext | None = None,
    host: HostFingerprint | None = None,
) -> LoadedEngine:
    """`enginecache.load_or_build` on the ORM (see `service.serving.runtime`)."""
    started = time.perf_counter()
    timer = PhaseTimer()
    app = app or app_for(home, db_url)
    with timer.phase("fingerprint"):
        host = host or local_host()
    path = Path(onnx_path)
    event = LoadEventRecord(
        hostname=host.hostname,
        model_name=path.stem,
        backend=spec.backend,
        precision=spec.precision,
        host_target="",  # the backend's name for this host, once the backend is known
        outcome="miss",
    )

    recorded: list[str] = []

    def finish(outcome: str, reason: str, engine: EngineRecord | None = None) -> None:
        event.outcome, event.reason = outcome, reason
        event.engine_id = engine.id if engine is not None else event.engine_id
        event.phases = dict(timer.phases)
        for column, seconds in phase_seconds(timer.phases).items():
            setattr(event, column, seconds)
        event.total_s = time.perf_counter() - started
        record_event(app, event)
        recorded.append(outcome)

    hold = BlobHold()  # the blob held while the engine lives (core.diskbudget)

    def loaded(session: Any, engine: EngineRecord, outcome: str, digest: str, model: ModelRecord) -> LoadedEngine:
        result = LoadedEngine(
            session, engine, outcome, dict(timer.phases), digest, facts=engine_facts(app, engine), model_name=model.name
        )
        result._hold = hold
        return result

    try:
        event.host_target = get_backend(spec.backend).host_target(host)
        with timer.phase("lookup"):
            digest = onnx_digest(app, path, host=host)
            event.stat_cache_hit = digest.stat_cache_hit
            model = find_model_by_digest(app, digest.digest)
            plan = None
            engine = None
            ready: list[int] = []
            if model is not None:
                event.model_id, event.model_name = model.id, model.name
                plan = plan_build(app, spec.request(str(model.id)), host=host)
                ready = _ready_engine_ids(app, model.id or 0)
                engine = find_engine(app, plan, host)
        if engine is not None and model is not None and plan is not None:
            try:
                session = load_engine_record(app, engine, timer, hold=hold, request=signed_request(plan, engine))
            except EngineRejectedError as err:
                finish("rejected", str(err), engine)
                remember_hit(app, spec, plan, engine, ready, host)  # the same verdict, sooner, next time
                raise
            finish("hit", f"engine {engine.id}", engine)
            remember_hit(app, spec, plan, engine, ready, host)
            return loaded(session, engine, "hit", digest.digest, model)
        # -- a miss ----------------------------------------------------------------------------
        miss = explain_miss(app, plan, host) if plan is not None else unknown_model_miss(app, path, digest.digest)
        if on_miss == "fail":
            finish("miss", str(miss))
            raise miss
        if model is None:
            model = register_model(app, path, new_version=True).model  # new bytes of a served file
            event.model_id, event.model_name = model.id, model.name
        request = spec.request(str(model.id))
        if on_miss == "queue":
            submitted = submit_build(app, request)
            if submitted.cache_hit and submitted.engine is not None:  # built meanwhile
                return load_or_build_full(path, spec=spec, on_miss="fail", app=app, host=host)
            job_id = submitted.job.id if submitted.job is not None else None
            finish("miss", f"{miss}; queued build job {job_id}")
            raise EngineQueuedError(
                f"{miss}; queued build job {job_id}", nearest=miss.nearest, diffs=miss.diffs, job_id=job_id
            )
        with timer.phase("build"):
            built = build_engine(app, request, host=host).engine
        try:
            plan = plan or plan_build(app, request, host=host)
            session = load_engine_record(app, built, timer, hold=hold, request=signed_request(plan, built))
        except EngineRejectedError as err:
            finish("rejected", f"built engine {built.id}, then: {err}", built)
            raise
        finish("built", f"{miss}; built engine {built.id}", built)
        return loaded(session, built, "built", digest.digest, model)
    except BaseException as err:
        if not recorded:  # every call leaves an event, also one that fails
            finish("failed", f"{type(err).__name__}: {err}")
        raise
