"""The backend contract: one small Protocol every backend module implements."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from core.fingerprint import HostFingerprint
from core.profiles import ProfileResult

if TYPE_CHECKING:
    from core.session import EngineSession, LoadSpec, PhaseTimer


@dataclass(frozen=True)
class ProgressEvent:
    """A build phase started, advanced or finished (from TensorRT's IProgressMonitor)."""

    kind: str  # "start" | "step" | "finish"
    phase: str
    parent: str | None = None
    step: int | None = None
    steps: int | None = None


ProgressCallback = Callable[[ProgressEvent], None]
LogCallback = Callable[[str], None]


@dataclass(frozen=True)
class BuildSpec:
    """What to build: a (possibly precision-converted) ONNX model for targets with profiles."""

    onnx_path: Path
    targets: tuple[str, ...]
    profile: ProfileResult
    precision: str = "fp32"
    opt_level: int | None = None
    workspace_bytes: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TensorIO:
    name: str
    mode: str  # "input" | "output"
    dtype: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class BuildOutput:
    """A serialized engine written to `engine_path` by a backend, with what it reported."""

    engine_path: Path
    io: tuple[TensorIO, ...]
    log: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompatibilityResult:
    verdict: str  # "compatible" | "incompatible" | "unknown"
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "details": dict(self.details)}


@dataclass(frozen=True)
class EngineRef:
    """What a compatibility check knows of an engine from the catalog."""

    path: Path
    backend: str
    backend_version: str
    targets: tuple[str, ...]
    precision: str


class Backend(Protocol):
    """A build/load backend. GPU libraries are imported lazily, inside its methods."""

    name: str

    def version(self) -> str:
        """The exact library version; raises BackendUnavailableError when not installed."""
        ...

    def default_targets(self, host: HostFingerprint) -> tuple[str, ...]:
        """Targets used when the user names none."""
        ...

    def resolve_targets(self, requested: tuple[str, ...], host: HostFingerprint) -> tuple[str, ...]:
        """Validate requested targets (raise TargetError), or the defaults when empty."""
        ...

    def build(
        self, spec: BuildSpec, output: Path, progress: ProgressCallback | None = None, log: LogCallback | None = None
    ) -> BuildOutput:
        """Build into `output`; phases go to `progress`, builder log lines to `log` as they come."""
        ...

    def check_compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult: ...

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        """Check the engine with the backend's own validity test (phase `validity`; raises
        IncompatibleEngineError with its diagnostic), then deserialize it from the verified bytes
        and prepare I/O for `spec.input_shapes` (phases timed into `timer`)."""
        ...
