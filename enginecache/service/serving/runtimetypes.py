"""What `load_or_build` takes and gives: `RuntimeSpec` and `LoadedEngine`.

Light on purpose (no database, numpy or runtime imports, no `dataclasses` or `typing`): a serving
process's cache hit imports this module, and `enginecache.service.serving.runtime` re-exports both names.
Both are `core.valuetype` values: what the dataclasses they were gave (`replace(...)` for
`dataclasses.replace`).
"""

from __future__ import annotations

import os

from enginecache.core.valuetype import Frozen, Mutable, field

# How long close() waits for a load event still being written (a slow but answering catalog); one that
# does not answer is cut short by the event's own connect timeout (service.serving.pulled).
PENDING_JOIN_SECONDS = 60.0
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    import threading
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any, Literal

    import numpy as np

    from enginecache.core.backends.base import EngineSession
    from enginecache.core.diskbudget import BlobHold
    from enginecache.db.models import EngineRecord
    from enginecache.service.builds.plan import BuildRequest
    from enginecache.service.serving.engineload import EngineFacts

    OnMiss = Literal["build", "fail", "queue"]
else:
    OnMiss = str  # at run time: Literal["build", "fail", "queue"] for type checkers


class RuntimeSpec(Frozen):
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
        from enginecache.service.builds.plan import BuildRequest

        return BuildRequest(model=model, **self.asdict())

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (the serving state file, the hit path's memo key)."""
        data = self.asdict()
        data["targets"], data["profiles"] = list(self.targets), list(self.profiles)
        data["calibration"] = str(self.calibration) if self.calibration is not None else None
        return data


class LoadedEngine(Mutable):
    """A loaded engine session with what load_or_build did to get it.

    `engine` is the catalog row (an `EngineRecord`). A cache hit answered without the ORM
    (`service.serving.hitpath`) builds that record on first access only, so serving code that never
    touches it imports no SQLAlchemy; `engine_id` and `facts` need nothing. Until `close()`, it
    holds its blob (`core.diskbudget.BlobHold`): no disk budget evicts an engine a live process has
    loaded.
    """

    session: EngineSession
    _engine: EngineRecord | Callable[[], EngineRecord]
    outcome: str  # "hit" | "built"
    phases: dict[str, float] = field(default_factory=dict)
    onnx_digest: str = ""
    facts: EngineFacts | None = None
    model_name: str = ""
    state_file: Path | None = None  # the serving state written for this load, removed on close
    via: str = "fullpath"  # "hitpath": answered by service.serving.hitpath (stdlib sqlite3, the memo)

    __slots__ = ("_hold", "_pending")

    def __post_init__(self) -> None:
        self._pending: threading.Thread | None = None  # a background write close() waits for (service.serving.pulled)
        self._hold: BlobHold | None = None  # the blob held while the engine lives (core.diskbudget), closed by close()

    def __repr__(self) -> str:  # as the dataclass's: `_engine` (a record or its loader) left out
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields if name != "_engine")
        return f"{self.__class__.__qualname__}({fields})"

    @property
    def engine(self) -> EngineRecord:
        if callable(self._engine):
            self._engine = self._engine()
        return self._engine

    @property
    def engine_id(self) -> int | None:
        if self.facts is not None:
            return self.facts.id
        return self.engine.id

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
        if self._hold is not None:
            self._hold.close()  # from now on a disk budget may evict the blob
            self._hold = None
        if self._pending is not None:
            self._pending.join(PENDING_JOIN_SECONDS)
            self._pending = None
        if self.state_file is not None:
            from enginecache.service.serving.servestate import remove_state

            remove_state(self.state_file, os.getpid())
            self.state_file = None

    def __enter__(self) -> LoadedEngine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
