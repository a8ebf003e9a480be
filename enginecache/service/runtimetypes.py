"""What `load_or_build` takes and gives: `RuntimeSpec` and `LoadedEngine`.

Light on purpose (no database, numpy or runtime imports): a serving process's cache hit imports
this module, and `enginecache.service.runtime` re-exports both names.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np

    from enginecache.core.backends.base import EngineSession
    from enginecache.db.models import EngineRecord
    from enginecache.service.builds import BuildRequest
    from enginecache.service.engineload import EngineFacts

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
        from enginecache.service.builds import BuildRequest

        return BuildRequest(model=model, **asdict(self))

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe (the serving state file, the hit path's memo key)."""
        data = asdict(self)
        data["targets"], data["profiles"] = list(self.targets), list(self.profiles)
        data["calibration"] = str(self.calibration) if self.calibration is not None else None
        return data


@dataclass
class LoadedEngine:
    """A loaded engine session with what load_or_build did to get it.

    `engine` is the catalog row (an `EngineRecord`). A cache hit answered without the ORM
    (`service.hitpath`) builds that record on first access only, so serving code that never
    touches it imports no SQLAlchemy; `engine_id` and `facts` need nothing.
    """

    session: EngineSession
    _engine: EngineRecord | Callable[[], EngineRecord] = field(repr=False)
    outcome: str  # "hit" | "built"
    phases: dict[str, float] = field(default_factory=dict)
    onnx_digest: str = ""
    facts: EngineFacts | None = None
    model_name: str = ""
    state_file: Path | None = None  # the serving state written for this load, removed on close
    via: str = "fullpath"  # "hitpath": answered by service.hitpath (stdlib sqlite3, the memo)

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
        if self.state_file is not None:
            from enginecache.service.servestate import remove_state

            remove_state(self.state_file, os.getpid())
            self.state_file = None

    def __enter__(self) -> LoadedEngine:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
