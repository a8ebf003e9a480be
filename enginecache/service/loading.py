"""Loading a catalog engine here: read and verify its blob in one pass, then the backend's load.

Whatever refuses the engine is an `EngineRejectedError` with its verdict: CORRUPT (the bytes do not
match the recorded digest, or the blob is gone; the engine is marked CORRUPT), INCOMPATIBLE (the
backend's own validity check) or ERROR (the runtime could not load it).
"""

from __future__ import annotations

from enginecache.core.backends.base import EngineSession, LoadSpec, PhaseTimer
from enginecache.core.backends.registry import get_backend
from enginecache.core.hashing import read_verified
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import EngineRejectedError, IncompatibleEngineError, IntegrityCheckError, LoadFailedError
from enginecache.service.context import AppContext
from enginecache.service.enginerefs import engine_targets


def read_engine(app: AppContext, engine: EngineRecord, timer: PhaseTimer | None = None) -> bytearray:
    """The engine's blob, verified (BLAKE3 when recorded, else sha256) in the pass that reads it
    (phase `read_verify`). A mismatch or a missing blob marks the engine CORRUPT and raises
    EngineRejectedError (verdict CORRUPT)."""
    timer = timer or PhaseTimer()
    path = app.home / (engine.blob_path or "")
    try:
        with timer.phase("read_verify"):
            if engine.blake3:
                return read_verified(path, blake3_digest=engine.blake3)
            return read_verified(path, sha256=engine.sha256 or "")
    except (IntegrityCheckError, OSError) as err:
        mark_corrupt(app, engine.id or 0)
        raise EngineRejectedError(
            f"engine {engine.id} is CORRUPT and was refused (now marked CORRUPT): {err}",
            engine_id=engine.id or 0,
            verdict="CORRUPT",
        ) from err


def load_engine_record(app: AppContext, engine: EngineRecord, timer: PhaseTimer) -> EngineSession:
    """Read and verify the engine's blob in one pass, then load it; CORRUPT marks the engine.

    Raises EngineRejectedError (CORRUPT, INCOMPATIBLE or ERROR).
    """
    buffer = read_engine(app, engine, timer)
    profiles = engine.build_options.get("profiles", {})
    spec = LoadSpec(
        input_shapes={name: tuple(p["opt"]) for name, p in profiles.items()},
        label=f"engine {engine.id}",
        backend_version=engine.backend_version,
        targets=engine_targets(engine),
    )
    try:
        return get_backend(engine.backend).load(buffer, spec, timer)
    except IncompatibleEngineError as err:
        raise EngineRejectedError(
            str(err), engine_id=engine.id or 0, verdict="INCOMPATIBLE", details=err.details
        ) from err
    except LoadFailedError as err:
        raise EngineRejectedError(str(err), engine_id=engine.id or 0, verdict="ERROR") from err


def mark_corrupt(app: AppContext, engine_id: int) -> None:
    with app.catalog.write() as session:
        row = session.get(EngineRecord, engine_id)
        if row is not None:
            row.status = EngineStatus.CORRUPT
            session.add(row)
