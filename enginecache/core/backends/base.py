"""The backend contract: what every backend package implements, and the value types it trades in.

A backend owns its policy (the way Polygraphy keeps each backend's loader and runner together):
how it builds, how it loads (its session), its targets and label, its dtype names, the one rule
that says whether a host can load one of its engines and why not, and what a worker must have to
build or to load one. Service and dashboard code ask the backend through this interface; they never
switch on backend names.

A session runs the bytes that were hashed: `load` makes it from the engine bytes already verified in
memory (a leased store file mapped read-only, or a verified copy where no lease can be had), lent for
the call alone; `load_file`, for a backend whose runtime reads files itself (`reads_files`), from a
store file whose bytes were verified where they lie and cannot change while the runtime reads them (a
read lease, `core.filelease`). Each load phase (validity check, deserialize, execution
context, I/O allocation) is timed into a `PhaseTimer`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

# The value types a load creates live in `loadtypes` (no dataclasses: a cache hit imports that, not this).
from enginecache.core.backends.loadtypes import ENGINE_HEADER_BYTES as ENGINE_HEADER_BYTES
from enginecache.core.backends.loadtypes import LoadSpec as LoadSpec
from enginecache.core.backends.loadtypes import PhaseTimer as PhaseTimer
from enginecache.core.backends.loadtypes import TensorIO as TensorIO
from enginecache.core.backends.loadtypes import TritonInfo as TritonInfo
from enginecache.core.backends.loadtypes import numpy_dtype as numpy_dtype
from enginecache.core.verdicts import Verdict
from enginecache.errors import TargetError

if TYPE_CHECKING:  # numpy and the profiles (which import onnx) stay out of a serving process's cache hit
    import numpy as np

    from enginecache.core.backends.declaration import BackendDeclaration
    from enginecache.core.hostfingerprint import HostFingerprint
    from enginecache.core.profiles import ProfileResult

Feeds = Mapping[str, "np.ndarray"]
Requirements = dict[str, Any]


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
    """What to build: a (possibly precision-converted) ONNX model for targets with profiles.

    `onnx_path` and the external data files beside it are read-only to a backend: they may be the
    stored model's own files, linked into the build's folder (`service.models.verify.stage_bundle`)."""

    onnx_path: Path
    targets: tuple[str, ...]
    profile: ProfileResult
    precision: str = "fp32"
    opt_level: int | None = None
    workspace_bytes: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BuildOutput:
    """A serialized engine written to `engine_path` by a backend, with what it reported."""

    engine_path: Path
    io: tuple[TensorIO, ...]
    log: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompatibilityResult:
    """The rule's answer: COMPATIBLE, INCOMPATIBLE or UNKNOWN (`core.verdicts`), and why."""

    verdict: Verdict
    reason: str
    details: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": str(self.verdict), "reason": self.reason, "details": dict(self.details)}

    @property
    def compatible(self) -> bool:
        return self.verdict == Verdict.COMPATIBLE


@dataclass(frozen=True)
class EngineRef:
    """What a compatibility check knows of an engine from the catalog (`path` where the blob is local)."""

    backend: str
    backend_version: str
    targets: tuple[str, ...]
    precision: str
    os: str | None = None
    path: Path | None = None


class EngineSession(Protocol):
    """A loaded engine, ready to run."""

    backend: str
    io: tuple[TensorIO, ...]

    def infer(self, feeds: Feeds) -> dict[str, np.ndarray]:
        """Run once; returns every output by name as host numpy arrays."""
        ...

    def close(self) -> None:
        """Release the session (device memory, contexts)."""
        ...


class Backend(Protocol):
    """A build/load backend. GPU libraries are imported lazily, inside its methods."""

    name: str
    label: str  # "TensorRT-RTX"
    declaration: BackendDeclaration  # what its package declares (`core.backends.registry` lists it)
    module: str  # the Python module of its library ("tensorrt_rtx"): `declaration.library`
    device: str  # "gpu" | "cpu": what its engines run on
    precision_family: str  # "tensorrt" | "ort": which int8/fp8 recipe its graphs need (core.precision)
    # Whether its runtime reads an engine file itself, so `load_file` costs no copy of ours (ONNX
    # Runtime); False: its runtime deserializes from memory, and a load hands `load` the verified bytes
    # (the leased store file's read-only mapping, or a verified copy).
    reads_files: bool

    def version(self) -> str:
        """The exact library version; raises BackendUnavailableError when not installed."""
        ...

    # -- targets ------------------------------------------------------------------------

    def default_targets(self, host: HostFingerprint) -> tuple[str, ...]:
        """Targets used when the user names none."""
        ...

    def resolve_targets(self, requested: tuple[str, ...], host: HostFingerprint) -> tuple[str, ...]:
        """Validate requested targets (raise TargetError), or the defaults when empty."""
        ...

    def known_targets(self) -> tuple[str, ...]:
        """Targets it can build for from any host (TensorRT-RTX's compute capabilities); () if it
        builds only for the hardware it runs on."""
        ...

    def target_info(self, targets: tuple[str, ...], host: HostFingerprint) -> dict[str, Any]:
        """The target as a cache-key ingredient."""
        ...

    def host_target(self, host: HostFingerprint) -> str:
        """This host as a load target: 'sm86,sm89' (GPU backends, 'no-gpu' without one) or 'x86_64-avx2'."""
        ...

    def show_targets(self, targets: tuple[str, ...]) -> str:
        """Targets as an operator reads them ('SM86,SM89', 'x86_64-avx2')."""
        ...

    def covers(self, targets: tuple[str, ...], host: HostFingerprint) -> bool:
        """Whether the engine's targets include this host's hardware (library versions aside)."""
        ...

    def dtype(self, native: Any) -> str:
        """The library's tensor type (TensorRT DataType, ORT type string) as our dtype name."""
        ...

    # -- policy -------------------------------------------------------------------------

    def compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        """THE rule: can `host` (this one, or a worker as the catalog recorded it) load `engine`, and
        why not. Decided from the fingerprint (library version, OS, GPUs or CPU target); loads no
        library. `check_compatibility` adds the library's own header check on this host."""
        ...

    def check_compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        """`compatibility`, then the library's own check of the engine's header here, where it has one."""
        ...

    def build_requirements(self, target_info: Mapping[str, Any], backend_version: str, os_name: str) -> Requirements:
        """What a worker must have to build this engine (matched by `service.jobs.routing.can_run`)."""
        ...

    def load_requirements(self, targets: tuple[str, ...]) -> Requirements:
        """What a worker must have to load an engine built for `targets`."""
        ...

    def describe_buildable(self, capabilities: Mapping[str, Any]) -> str:
        """What a worker with these capabilities can build with this backend, in words."""
        ...

    def describe_loadable(self, capabilities: Mapping[str, Any]) -> str:
        """What such a worker can load, in words."""
        ...

    def worker_build_requirements(self, requested: tuple[str, ...]) -> Requirements | None:
        """Where the library is missing on the planning host: what a live worker must have to build
        `requested` there (that worker's fingerprint and library version then go into the cache key),
        or None where a build is planned only on a host with the library. TensorRT, which builds for
        the GPU it runs on, names that GPU; raises TargetError when `requested` names no single one."""
        ...

    # -- exports ------------------------------------------------------------------------

    @property
    def triton(self) -> TritonInfo:
        """How Triton serves this backend's engines."""
        ...

    def triton_cc_keys(self, targets: tuple[str, ...]) -> tuple[str, ...]:
        """The keys Triton's `cc_model_filenames` files an engine built for `targets` under ('8.6' for
        sm86), one per target; () where a Triton model has one file whatever the hardware."""
        ...

    def hardware_names(self, targets: tuple[str, ...], target_info: Mapping[str, Any]) -> tuple[str, ...]:
        """The hardware an export tree files an engine under, one name per target: the SM ('sm86'),
        the GPU and SM where the engine is tuned on that GPU model ('NVIDIA A10-sm86'), the CPU target."""
        ...

    # -- build and load -----------------------------------------------------------------

    def build(
        self, spec: BuildSpec, output: Path, progress: ProgressCallback | None = None, log: LogCallback | None = None
    ) -> BuildOutput:
        """Build into `output`; phases go to `progress`, builder log lines to `log` as they come."""
        ...

    def prove_loadable(self, engine_path: Path, spec: LoadSpec, host: HostFingerprint) -> str:
        """Prove on the building host that the engine just built loads, where that can be proven
        here (LoadFailedError with the runtime's words where it does not); returns what was proven,
        or why nothing could be. An engine becomes READY only after this."""
        ...

    def check_header(self, header: bytes, spec: LoadSpec, timer: PhaseTimer | None = None) -> None:
        """The validity test `load` starts with, on the engine's first `ENGINE_HEADER_BYTES` bytes
        (all of it when shorter): raises IncompatibleEngineError with the library's diagnostic (phase
        `validity`). A caller refuses an engine this host cannot run before reading all of it."""
        ...

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        """Check the engine with the backend's own validity test (phase `validity`; raises
        IncompatibleEngineError with its diagnostic), then deserialize it from the verified bytes
        and prepare I/O for `spec.input_shapes` (phases timed into `timer`). `engine` is lent for the
        call: the session keeps no view of it (a mapping is unmapped, and its lease given back, once
        this returns; a view still held then refuses the load)."""
        ...

    def load_file(self, path: str, spec: LoadSpec, timer: PhaseTimer | None = None) -> EngineSession:
        """`load` from a file whose bytes were verified and cannot change while this runs (a leased
        store file, `core.filelease`): where `reads_files`, the runtime reads it itself."""
        ...


def local_targets_only(
    local: tuple[str, ...],
    wanted: tuple[str, ...] | None,
    refusal: Callable[[tuple[str, ...]], str],
    *,
    alias: tuple[str, ...] | None = None,
) -> tuple[str, ...]:
    """`resolve_targets` for a backend that builds only for the hardware it runs on: its `local`
    targets, where nothing is asked (`wanted` None) or what is asked is `local` (or `alias`, a name
    the backend also takes for it); anything else raises TargetError in the backend's words,
    `refusal(wanted)`."""
    if wanted is not None and wanted != local and wanted != alias:
        raise TargetError(refusal(wanted))
    return local


def verdict(built: str, reasons: list[str], details: Mapping[str, Any], ok: str) -> CompatibilityResult:
    """INCOMPATIBLE with every reason, or COMPATIBLE saying why (`ok`)."""
    if reasons:
        return CompatibilityResult(Verdict.INCOMPATIBLE, f"{built}; " + "; ".join(reasons), details)
    return CompatibilityResult(Verdict.COMPATIBLE, f"{built}; {ok}", details)


def same_release(installed: str, recorded: str) -> bool:
    """Whether the installed library is the version an engine records: the same, or one it names only
    in part (an imported engine whose header proves "1.7.1" runs on 1.7.1.116)."""
    return installed == recorded or installed.startswith(recorded + ".")


def common_reasons(engine: EngineRef, host: HostFingerprint, label: str, module: str) -> tuple[list[str], str | None]:
    """The reasons every backend shares: its library missing or at another version (an engine whose
    version is not recorded, an import that declared none, is judged on the rest), another OS.
    Returns (reasons, installed version)."""
    installed = host.packages.get(module)
    reasons: list[str] = []
    if not installed:
        reasons.append(f"{label} is not installed on this host")
    elif engine.backend_version and not same_release(installed, engine.backend_version):
        reasons.append(f"this host has {label} {installed}, the engine needs {engine.backend_version}")
    if engine.os and host.os and engine.os != host.os:
        reasons.append(f"the engine was built for {engine.os}, this host runs {host.os}")
    return reasons, installed
