"""What an engine file's own first bytes prove about it, read on any host (no GPU), for `engine
import` to check a declaration against.

A backend may offer, beside the contract in `core.backends.base`, `header_facts(header: bytes) ->
HeaderFacts`, and `import_targets` / `import_target_info` (the targets an import declares, and its
cache key's `target` ingredient); TensorRT, TensorRT-RTX and ONNX Runtime do. The functions here ask
for them; a backend without them proves nothing (every fact of its import is declared) and takes its
targets as given. A fact the header
does not prove is None, never a guess; `refusal` is set where the bytes are not an engine of that
backend at all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class HeaderFacts:
    """The header's proven facts (None: not proven), the library's own check, and notes in words."""

    format: str | None = None  # what the bytes are, in words ("TensorRT-RTX 1.7.1 plan")
    targets: tuple[str, ...] | None = None  # the compute capabilities (or CPU targets) it was built for
    backend_version: str | None = None  # the library version that wrote it, as far as the header says
    checks: dict[str, Any] = field(default_factory=dict)  # the library's own header check, as it answered
    notes: tuple[str, ...] = ()
    refusal: str | None = None  # the bytes are not an engine of this backend: why

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "targets": list(self.targets) if self.targets is not None else None,
            "backend_version": self.backend_version,
            "checks": dict(self.checks),
            "notes": list(self.notes),
        }


class _ReadsHeaders(Protocol):
    def header_facts(self, header: bytes) -> HeaderFacts: ...


class _DeclaresTargets(Protocol):
    def import_targets(self, requested: tuple[str, ...]) -> tuple[str, ...]: ...

    def import_target_info(self, targets: tuple[str, ...]) -> dict[str, Any]: ...


def declared_targets(backend: object, requested: tuple[str, ...]) -> tuple[str, ...]:
    """The targets an import declares, as `backend.import_targets` validates them where it offers that
    (else as given, comma lists split); () where none are declared."""
    if callable(getattr(backend, "import_targets", None)):
        declares: _DeclaresTargets = backend  # type: ignore[assignment]
        return declares.import_targets(requested)
    from enginecache.core.targettext import split_requested

    return tuple(split_requested(requested))


def declared_target_info(backend: object, targets: tuple[str, ...]) -> dict[str, Any]:
    """The cache key's `target` ingredient of an import built for `targets`: the backend's answer
    where it offers one (`import_target_info`), else the targets alone."""
    if callable(getattr(backend, "import_target_info", None)):
        declares: _DeclaresTargets = backend  # type: ignore[assignment]
        return declares.import_target_info(targets)
    return {"targets": list(targets)}


def read_header_facts(backend: object, header: bytes) -> HeaderFacts:
    """`backend.header_facts(header)` where the backend offers it, else a `HeaderFacts` proving nothing."""
    reader: _ReadsHeaders | None = backend if callable(getattr(backend, "header_facts", None)) else None  # type: ignore[assignment]
    if reader is None:
        name = getattr(backend, "name", "this backend")
        return HeaderFacts(notes=(f"{name} reads no facts from an engine's header: every fact is declared",))
    return reader.header_facts(header)
