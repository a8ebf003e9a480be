"""enginecache: build TensorRT engines once per GPU and precision, load them in milliseconds.

The public API for serving code::

    from enginecache import RuntimeSpec, load_or_build

    engine = load_or_build("/models/resnet18.onnx", spec=RuntimeSpec(backend="rtx", precision="fp16"))

with the error types of `enginecache.errors` (`EngineRejectedError`, `MissError`, ...). Names are
resolved on first use (PEP 562), so `import enginecache` stays cheap and loads no database or GPU
library until a serving process asks for one.

Packages, imports pointing down only: `cli` | `dashboard` -> `service` -> `core` | `db`;
`errors` is the one error tree every layer raises from (docs/architecture.md).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

    from enginecache.errors import (
        BadInputError,
        EngineCacheError,
        EngineQueuedError,
        EngineRejectedError,
        IncompatibleEngineError,
        MissError,
        NotFoundError,
        UnavailableError,
    )
    from enginecache.service.serving.runtime import LoadedEngine, RuntimeSpec, load_or_build

_LAZY = {
    "load_or_build": "enginecache.service.serving.runtime",
    "RuntimeSpec": "enginecache.service.serving.runtime",
    "LoadedEngine": "enginecache.service.serving.runtime",
    "EngineCacheError": "enginecache.errors",
    "BadInputError": "enginecache.errors",
    "NotFoundError": "enginecache.errors",
    "MissError": "enginecache.errors",
    "EngineQueuedError": "enginecache.errors",
    "EngineRejectedError": "enginecache.errors",
    "IncompatibleEngineError": "enginecache.errors",
    "UnavailableError": "enginecache.errors",
}

__all__ = [
    "BadInputError",
    "EngineCacheError",
    "EngineQueuedError",
    "EngineRejectedError",
    "IncompatibleEngineError",
    "LoadedEngine",
    "MissError",
    "NotFoundError",
    "RuntimeSpec",
    "UnavailableError",
    "load_or_build",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'enginecache' has no attribute {name!r}")
    value = getattr(__import__(module, fromlist=[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
