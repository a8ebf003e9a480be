"""`load_or_build()` for serving processes: the engine for this model, spec and host, loaded, in
milliseconds on a cache hit.

It lives in `service`, not `core`, because it needs the catalog and `core` never imports `db`
(docs/design-decisions.md, "Layers and packaging").

Two paths give the same answers. A cache hit in a new process is answered by `service.serving.hitpath`
with the stdlib's sqlite3 (no SQLAlchemy, SQLModel, Alembic or onnx imported): the stat cache row,
the memo of this request's engine, one read transaction, then the verified load and one INSERT of
the event. Everything else, and everything that path cannot vouch for, takes the full path
(`service.serving.loadpath`: stat cache, `plan_build`, `find_engine`, misses that build, fail or queue),
which writes the memo after a hit. Both load through `service.serving.engineload`: the backend's header
check, one pass that reads and verifies the blob into the buffer the runtime gets, then its load.

This module imports neither path's dependencies until it is called, so
`from enginecache import load_or_build` stays cheap.

Every call records a load event (hit | miss | built | rejected | failed) with seconds per phase.
With `state_file=` (or ENGINECACHE_STATE_FILE) a verified load also writes the serving state that
`enginecache ready --state` checks (`service.serving.servestate`).
"""

from __future__ import annotations

import os
import time

from enginecache.errors import EngineCacheError
from enginecache.service.serving.runtimetypes import LoadedEngine, OnMiss, RuntimeSpec

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from pathlib import Path

    from enginecache.core.fingerprint import HostFingerprint
    from enginecache.service.context import AppContext

__all__ = ["LoadedEngine", "OnMiss", "RuntimeSpec", "load_or_build"]

STATE_FILE_ENV = "ENGINECACHE_STATE_FILE"  # where to write the serving state when no state_file= is given


def load_or_build(
    onnx_path: str | Path,
    *,
    spec: RuntimeSpec | None = None,
    home: str | Path | None = None,
    db_url: str | None = None,
    on_miss: OnMiss = "build",
    app: AppContext | None = None,
    host: HostFingerprint | None = None,
    state_file: str | os.PathLike[str] | None = None,
) -> LoadedEngine:
    """The loaded engine for this ONNX file, spec and host; on a miss build it, fail or queue a build.

    `onnx_path` may instead be a manifest `enginecache pull` wrote (`DIR/manifests/MODEL.json`): the
    pulled engine is verified against it and loaded with no catalog (`service.serving.pulled`; `spec=None`
    serves what was pulled, a spec must agree with it).

    Raises MissError (on_miss="fail"; the nearest engine and the differing fields in it),
    EngineQueuedError (on_miss="queue", with the job id), EngineRejectedError (the cached engine is
    CORRUPT or INCOMPATIBLE here), or a EngineCacheError for a bad spec.

    `state_file` (default: $ENGINECACHE_STATE_FILE, if set): where to write this process's serving
    state after the verified load, for `enginecache ready --state` (removed by `close()`).
    """
    if on_miss not in ("build", "fail", "queue"):
        raise EngineCacheError(f"on_miss must be build, fail or queue, not {on_miss!r}")
    started = time.perf_counter()
    if str(onnx_path).endswith(".json"):  # a folder `enginecache pull` filled: no catalog needed
        from pathlib import Path

        from enginecache.service.serving.pulled import is_pull_manifest, load_pulled

        if is_pull_manifest(Path(onnx_path)):
            pulled = load_pulled(Path(onnx_path), spec, db_url=app.db_url if app is not None else db_url)
            return _with_state(pulled, state_file, onnx_path, spec)
    spec = spec or RuntimeSpec()
    from enginecache.service.serving.hitpath import try_hit  # its imports: phase `import_hitpath`

    hit = try_hit(
        onnx_path,
        spec,
        home=app.home if app is not None else home,
        db_url=app.db_url if app is not None else db_url,
        host=host,
        started=started,
        imported_s=time.perf_counter() - started,
    )
    if hit is not None:
        return _with_state(hit, state_file, onnx_path, spec)
    from enginecache.service.serving.loadpath import load_or_build_full

    loaded = load_or_build_full(onnx_path, spec=spec, home=home, db_url=db_url, on_miss=on_miss, app=app, host=host)
    return _with_state(loaded, state_file, onnx_path, spec)


def _with_state(
    loaded: LoadedEngine,
    state_file: str | os.PathLike[str] | None,
    onnx_path: str | os.PathLike[str],
    spec: RuntimeSpec | None,
) -> LoadedEngine:
    """`loaded`, after writing its serving state where one is asked for (`state_file`, else
    $ENGINECACHE_STATE_FILE if set). Without one nothing more is imported (service.serving.servestate, which
    writes it, imports pathlib)."""
    chosen = state_file if state_file is not None else os.environ.get(STATE_FILE_ENV) or None
    if chosen is not None:
        from pathlib import Path

        _write_serving_state(Path(chosen), loaded, onnx_path, spec or RuntimeSpec())
    return loaded


def _write_serving_state(
    target: Path, loaded: LoadedEngine, onnx_path: str | os.PathLike[str], spec: RuntimeSpec
) -> None:
    from enginecache.core.pathtext import absolute_text
    from enginecache.service.serving.servestate import blob_stat, write_state

    facts = loaded.facts
    if facts is None:
        return
    loaded.state_file = write_state(
        target,
        {
            "outcome": loaded.outcome,
            "engine": {
                "id": facts.id,
                "backend": facts.backend,
                "backend_version": facts.backend_version,
                "precision": facts.precision,
                "targets": list(facts.targets),
                "blob": str(facts.blob),
                "blob_stat": blob_stat(facts.blob),
                "verified": facts.verified_digest,
            },
            "model": {"name": loaded.model_name, "path": absolute_text(onnx_path), "digest": loaded.onnx_digest},
            "spec": spec.to_dict(),
            "phases": loaded.phases,
        },
    )
