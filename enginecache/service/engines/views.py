"""What the CLI and the dashboard show of an engine beyond its catalog row: `HEAD_BYTES`, how much
of its blob the header digest covers (checked before the rest is read), and `download_name`, the
file name a downloaded engine is given (the backend's own suffix).

Imports no SQLAlchemy (a read command's `engine show` uses it); `download_name` imports the one
backend it names.
"""

from __future__ import annotations

from typing import Protocol

from enginecache.core.backends.registry import get_backend
from enginecache.core.hashing import HEAD_BYTES

__all__ = ["HEAD_BYTES", "EngineNaming", "download_name"]


class EngineNaming(Protocol):
    """What naming an engine's file reads of it (an engine row has these)."""

    @property
    def backend(self) -> str: ...

    @property
    def precision(self) -> str: ...

    @property
    def targets(self) -> str: ...


def download_name(engine: EngineNaming, model: str) -> str:
    """`convnet.fp32.sm86.plan`, `convnet.fp32.x86_64-avx2.ort`: the suffix is the backend's own."""
    suffix = get_backend(engine.backend).triton.file_suffix
    targets = engine.targets.replace(",", "-") or "any"
    return f"{model}.{engine.precision}.{targets}{suffix}"
