"""The readiness probe: is the engine for this model, spec and host loadable here (present,
verified and compatible)? It loads nothing: the blob is verified and the backend's
`check_compatibility` (its rule plus the library's header check) decides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from enginecache.core.backends.registry import get_backend
from enginecache.core.blobpaths import blob_path
from enginecache.core.fingerprint import HostFingerprint
from enginecache.errors import EngineRejectedError
from enginecache.service.builds.plan import plan_build
from enginecache.service.context import AppContext
from enginecache.service.jobs.refs import engine_ref
from enginecache.service.models.releases import resolve_model
from enginecache.service.serving.loading import read_engine
from enginecache.service.serving.localhost import local_host
from enginecache.service.serving.lookup import explain_miss, find_engine
from enginecache.service.serving.runtimetypes import RuntimeSpec


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
    host = host or local_host()
    record, _release = resolve_model(app, model, host)  # NAME@ALIAS resolved for this host's GPU class
    plan = plan_build(app, spec.request(str(record.id)), host=host)
    engine = find_engine(app, plan, host)
    if engine is None:
        return ReadyResult(False, str(explain_miss(app, plan, host)))
    try:
        read_engine(app, engine, by="ready")
    except EngineRejectedError as err:
        return ReadyResult(False, str(err), engine.id)
    ref = engine_ref(engine, blob_path(app.home, engine.sha256))  # the digest's path, just verified
    compat = get_backend(engine.backend).check_compatibility(ref, host)
    if not compat.compatible:
        return ReadyResult(False, f"engine {engine.id} is {compat.verdict} here: {compat.reason}", engine.id)
    return ReadyResult(True, f"engine {engine.id} verified and compatible: {compat.reason}", engine.id)
