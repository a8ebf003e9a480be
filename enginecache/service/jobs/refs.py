"""A catalog engine row as the backends take it: its target tuple, and the `EngineRef` their
compatibility rule decides on. One place, so `check`, routing, `ready`, `load_or_build`,
test-load and the dashboard's per-host column all hand the rule the same facts."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from enginecache.core.backends.base import EngineRef, TensorIO
from enginecache.core.targettext import split_targets

if TYPE_CHECKING:  # annotations only (routing imports this module)
    from enginecache.db.models import EngineRecord


def engine_targets(engine: EngineRecord) -> tuple[str, ...]:
    """The engine's targets ('sm86,sm89' -> ('sm86', 'sm89')); () where none are recorded."""
    return split_targets(engine.targets)


def engine_ref(engine: EngineRecord, path: Path | None = None) -> EngineRef:
    """What a compatibility rule knows of `engine`; `path` where its blob is local (for the header check)."""
    return EngineRef(
        backend=engine.backend,
        backend_version=engine.backend_version,
        targets=engine_targets(engine),
        precision=engine.precision,
        os=engine.os,
        path=path,
    )


def engine_io(engine: EngineRecord) -> tuple[TensorIO, ...]:
    """The engine's inputs and outputs as its build recorded them."""
    return tuple(TensorIO(t["name"], t["mode"], t["dtype"], tuple(t["shape"])) for t in engine.io)
