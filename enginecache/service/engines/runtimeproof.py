"""Use case: `enginecache engine confirm-load ID PATH`: a runtime outside enginecache loaded engine ID
on this host from PATH, which makes an UNPROVEN engine READY.

enginecache proves an engine itself where it can load it (a test-load's PASS). An engine bundle it
cannot: TensorRT-LLM loads the folder with its own plugins and GPU placement, so the serving host
says so once its runtime has loaded it (a sidecar after the server's readiness, say). The
confirmation is checked before anything is recorded:

- the engine is UNPROVEN (READY: nothing to do, said so; any other status: refused, as a test-load
  would be: there is nothing to prove);
- this host is one the backend's compatibility rule says can load the engine (a load on a host the
  rule refuses proves nothing about the hosts it allows);
- PATH holds exactly the engine's bytes: a bundle's folder every file of its manifest and nothing
  else, each matching (`core.enginebundle.folder_matches`), a single engine's file its digests.

Then `db.engines.mark_proven` records it READY with the proof (`by: runtime-load`, this host's
name and target, the path, a note), audited `engine.proven` in the same transaction. The
permission is a test-load's (operator).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginecache.core.backends.registry import get_backend
from enginecache.core.enginebundle import folder_matches
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.hashing import check_file
from enginecache.db import engines
from enginecache.db.models import EngineStatus, utcnow
from enginecache.errors import BadInputError, IncompatibleEngineError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext
from enginecache.service.engines.bundles import is_bundle, read_manifest
from enginecache.service.engines.records import get_engine
from enginecache.service.jobs.refs import engine_ref

logger = logging.getLogger(__name__)

PROVEN_BY = "runtime-load"


@dataclass(frozen=True)
class RuntimeLoadProof:
    """What `confirm_runtime_load` did: the engine, its status before, and whether it changed it."""

    engine_id: int
    was: str
    status: str
    host: str
    host_target: str

    @property
    def changed(self) -> bool:
        return self.was != self.status

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine_id": self.engine_id,
            "was": self.was,
            "status": self.status,
            "changed": self.changed,
            "host": self.host,
            "host_target": self.host_target,
        }


def confirm_runtime_load(
    app: AppContext, engine_id: int, path: Path, *, host: HostFingerprint | None = None, note: str = ""
) -> RuntimeLoadProof:
    """Record that a runtime on `host` (default: this one) loaded engine `engine_id` from `path`
    (module docstring). Raises NotFoundError (no such engine), BadInputError (not UNPROVEN or READY,
    `path` missing), IncompatibleEngineError (the rule refuses this host), IntegrityCheckError (`path`
    is not the engine's bytes), AccessDeniedError."""
    access.require(app, "test_load")
    engine = get_engine(app, engine_id)
    host = host or host_fingerprint()
    backend = get_backend(engine.backend)
    target = backend.host_target(host)
    if engine.status == EngineStatus.READY:
        return RuntimeLoadProof(engine_id, engine.status, engine.status, host.hostname, target)
    if engine.status != EngineStatus.UNPROVEN:
        raise BadInputError(f"engine {engine_id} is {engine.status}: there is no load to confirm")
    verdict = backend.compatibility(engine_ref(engine), host)
    if not verdict.compatible:
        raise IncompatibleEngineError(
            f"engine {engine_id} cannot load on this host ({target}): {verdict.reason}; a load here proves "
            "nothing about the hosts it is for",
            verdict.details,
        )
    path = Path(path)
    if not path.exists():
        raise BadInputError(f"{path} does not exist: give the folder or file the runtime loaded")
    label = f"engine {engine_id}"
    if is_bundle(engine):
        if not path.is_dir():
            raise BadInputError(f"engine {engine_id} is an engine bundle: give the folder the runtime loaded")
        folder_matches(path, read_manifest(app, engine), label)
    else:
        check_file(path, sha256=engine.sha256, blake3_digest=engine.blake3)
    details = {"host_target": target, "path": str(path.resolve()), **({"note": note} if note else {})}
    with app.catalog.changes() as ex:
        was = engines.mark_proven(
            ex,
            engine_id,
            at=utcnow(),
            host=host.hostname,
            actor=audit.current_actor(),
            by=PROVEN_BY,
            details=details,
        )
    status = EngineStatus.READY if was == EngineStatus.UNPROVEN else str(was or engine.status)
    logger.info("engine %s: a runtime on %s loaded it (%s)", engine_id, host.hostname, status)
    return RuntimeLoadProof(engine_id, str(was or engine.status), status, host.hostname, target)
