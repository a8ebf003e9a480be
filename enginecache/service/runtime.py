"""`load_or_build()` for serving processes: the engine for this model, spec and host, loaded, in
milliseconds on a cache hit.

It lives in `service` (not `core.runtime` as DESIGN.md sketches) because it needs the catalog, and
the layering DESIGN.md sets forbids `core` from importing `db`. Its steps each have a module:
the model's digest from the stat cache (`service.statcache`), the engine for this host or why there
is none (`service.lookup`), reading, verifying and loading it (`service.loading`); the readiness
probe is `service.readiness`. The catalog-free parts are in core: reading and verifying the blob
(`core.hashing.read_verified`), sessions and `load` (`core.backends`).

On a hit the only work that grows with size is reading the engine once: the ONNX digest comes
from the stat cache (a multi-GB model is not re-hashed), and the engine blob is verified in the
same pass that reads it into the buffer handed to the runtime.

Every call records a load event (hit | miss | built | rejected | failed) with seconds per phase.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from enginecache.core.backends.base import EngineSession, PhaseTimer
from enginecache.core.backends.registry import get_backend
from enginecache.core.fingerprint import HostFingerprint
from enginecache.db.models import EngineRecord, LoadEventRecord
from enginecache.errors import EngineCacheError, EngineQueuedError, EngineRejectedError
from enginecache.service.builds import BuildRequest, build_engine, plan_build
from enginecache.service.context import AppContext
from enginecache.service.events import record_event
from enginecache.service.jobs import submit_build
from enginecache.service.loading import load_engine_record
from enginecache.service.localhost import local_host
from enginecache.service.lookup import explain_miss, find_engine, unknown_model_miss
from enginecache.service.models import find_model_by_digest, register_model
from enginecache.service.statcache import onnx_digest

logger = logging.getLogger(__name__)

OnMiss = Literal["build", "fail", "queue"]


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


_APPS: dict[tuple[str | None, str | None], AppContext] = {}


def _app_for(home: str | Path | None, db_url: str | None) -> AppContext:
    """One context per (home, db_url) per process: the catalog is opened (and migrated) once."""
    key = (str(home) if home is not None else None, db_url)
    if key not in _APPS:
        _APPS[key] = AppContext.from_settings(home, db_url)
    return _APPS[key]


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
    host = host or local_host()
    path = Path(onnx_path)
    started = time.perf_counter()
    timer = PhaseTimer()
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
        event.host_target = get_backend(spec.backend).host_target(host)
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
        miss = explain_miss(app, plan, host) if plan is not None else unknown_model_miss(app, path, digest.digest)
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
