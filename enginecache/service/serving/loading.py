"""Loading a catalog engine here (the ORM path): its facts from the row, then `service.serving.engineload`
(which reads the blob from the path its digest implies, not the row's `blob_path`).

Whatever refuses the engine is an `EngineRejectedError` with its verdict: CORRUPT (the bytes do not
match the recorded digest, or the blob is gone; the engine is marked CORRUPT through `db.engines`,
audited once), INCOMPATIBLE (the
backend's own validity check) or ERROR (the runtime could not load it: the engine keeps its
status, since another host may load it, and its `error` says which host could not and the
runtime's words).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from enginecache.core.backends.base import EngineSession, PhaseTimer
from enginecache.core.diskbudget import BlobHold
from enginecache.core.verdicts import Verdict
from enginecache.db import engines
from enginecache.db.models import EngineRecord
from enginecache.errors import EngineRejectedError
from enginecache.service.access import audit
from enginecache.service.context import AppContext
from enginecache.service.jobs.refs import engine_targets
from enginecache.service.serving.engineload import EngineFacts, load_engine, load_error_note, read_blob
from enginecache.service.serving.runtimecache import for_catalog_engine

LOAD_OR_BUILD = "load_or_build"  # who found a CORRUPT blob while serving (the audit's `by`, both load paths)


def engine_facts(app: AppContext, engine: EngineRecord) -> EngineFacts:
    """What loading `engine` needs, from its row."""
    profiles = engine.build_options.get("profiles", {})
    return EngineFacts(
        id=engine.id or 0,
        backend=engine.backend,
        backend_version=engine.backend_version,
        precision=engine.precision,
        targets=engine_targets(engine),
        home=str(app.home),  # the blob's path follows from its sha256, never from the row's blob_path
        sha256=engine.sha256,
        blake3=engine.blake3,
        input_shapes={name: tuple(p["opt"]) for name, p in profiles.items()},
        header_blake3=engine.header_blake3,
        chunk_blake3=engine.chunk_blake3,
        cache_key=engine.cache_key,
        onnx_digest=engine.onnx_digest,
        size_bytes=engine.size_bytes,
        signed_statement=engine.signed_statement,
        signature=engine.signature,
    )


def read_engine(
    app: AppContext, engine: EngineRecord, timer: PhaseTimer | None = None, *, by: str = LOAD_OR_BUILD
) -> bytes:
    """The engine's blob, verified (BLAKE3 when recorded, else sha256) in the pass that reads it
    (phase `read_verify`). A mismatch or a missing blob marks the engine CORRUPT (audited as found
    `by` the caller: the readiness probe, a serving load) and raises EngineRejectedError (verdict
    CORRUPT)."""
    return read_blob(engine_facts(app, engine), timer or PhaseTimer(), _marker(app, engine.id or 0, by))


def load_engine_record(
    app: AppContext,
    engine: EngineRecord,
    timer: PhaseTimer,
    *,
    hold: BlobHold | None = None,
    request: Mapping[str, Any] | None = None,
) -> EngineSession:
    """Its signed statement checked against the row and `request` where trusted keys are configured,
    the backend's header check, then read and verify the blob in one pass, then load it; CORRUPT and
    TAMPERED mark the engine (audited as found by `load_or_build`). `hold` and `request` as
    `engineload.load_engine`'s. Raises EngineRejectedError (TAMPERED, UNTRUSTED, CORRUPT, INCOMPATIBLE
    or ERROR)."""
    engine_id = engine.id or 0
    try:
        facts = engine_facts(app, engine)
        return load_engine(
            facts,
            timer,
            on_corrupt=_marker(app, engine_id, LOAD_OR_BUILD),
            hold=hold,
            request=request,
            on_tampered=tamper_marker(app, engine_id, LOAD_OR_BUILD),
            runtime_cache=for_catalog_engine(app, engine),  # TensorRT-RTX: the fleet's best cache, if any
        )
    except EngineRejectedError as err:
        if err.verdict == Verdict.ERROR.outcome:
            with app.catalog.changes() as ex:
                engines.note_load_error(ex, engine_id, load_error_note(str(err)))
        raise


def tamper_marker(app: AppContext, engine_id: int, by: str) -> Callable[[str], None]:
    """`on_tampered` for `engineload`: the engine marked TAMPERED, with its audit row, in one transaction."""

    def mark(reason: str) -> None:
        with app.catalog.changes() as ex:
            engines.mark_tampered(ex, engine_id, actor=audit.current_actor(), by=by, reason=reason)

    return mark


def _marker(app: AppContext, engine_id: int, by: str) -> Callable[[str], None]:
    """`on_corrupt` for `engineload`: the engine marked CORRUPT, with its audit row, in one transaction."""

    def mark(reason: str) -> None:
        with app.catalog.changes() as ex:
            engines.mark_corrupt(ex, engine_id, actor=audit.current_actor(), by=by, reason=reason)

    return mark
