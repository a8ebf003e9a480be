"""What the CLI and the dashboard show of an engine beyond its catalog row: `HEAD_BYTES`, how much
of its blob the header digest covers (checked before the rest is read); `download_name`, the file
name a downloaded engine is given (the backend's own suffix); `EngineFacts`, what a view reads of
an engine row to name it and offer its actions.

Imports no SQLAlchemy (a read command's `engine show` uses it); `download_name` imports the one
backend it names.
"""

from __future__ import annotations

from typing import Protocol

from enginecache.core.backends.registry import get_backend
from enginecache.core.hashing import HEAD_BYTES

__all__ = ["HEAD_BYTES", "EngineFacts", "download_name"]


class EngineFacts(Protocol):
    """What a view reads of an engine to name it and offer its actions (an engine row has these)."""

    @property
    def id(self) -> int | None: ...

    @property
    def status(self) -> str: ...

    @property
    def backend(self) -> str: ...

    @property
    def precision(self) -> str: ...

    @property
    def targets(self) -> str: ...  # comma-separated, as the catalog keeps them


def download_name(engine: EngineFacts, model: str) -> str:
    """`convnet.fp32.sm86.plan`, `convnet.fp32.x86_64-avx2.ort`: the suffix is the backend's own."""
    suffix = get_backend(engine.backend).triton.file_suffix
    targets = engine.targets.replace(",", "-") or "any"
    return f"{model}.{engine.precision}.{targets}{suffix}"
