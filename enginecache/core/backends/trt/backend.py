"""TensorRT and TensorRT for RTX behind one code path.

Both libraries share the Builder / OnnxParser / BuilderConfig / Runtime API. Where they differ
the difference is detected by `hasattr` on the loaded module or object, not by version strings:

| capability                        | tensorrt_rtx                     | tensorrt                       |
|-----------------------------------|----------------------------------|--------------------------------|
| build without a GPU               | yes (CPU-only AOT)               | no: builds for the local GPU   |
| target choice                     | `config.set_compute_capability`  | the GPU it runs on             |
| strongly typed network flag       | `STRONGLY_TYPED` (default typing)| `STRONGLY_TYPED` (TRT 10+)     |
| header validity check             | `Runtime.get_engine_validity`    | not available                  |

Precision is in the ONNX graph (core.precision): networks are built strongly typed (the builder
run is in `build`), so no FP16/INT8 builder flags are used (TensorRT 11 removed them).
"""

from __future__ import annotations

from enginecache.core.backends.loadtypes import PhaseTimer, TritonInfo
from enginecache.core.backends.trt import RTX, TRT
from enginecache.core.backends.trt.dtypes import dtype_name
from enginecache.core.backends.trt.targets import (
    RTX_COMPUTE_CAPABILITIES,
    RTX_DEFAULT_TARGETS,
    parse_capabilities,
    parse_rtx_targets,
    sm_to_capability,
)
from enginecache.core.backends.trt.trtlog import captured, capturing_logger
from enginecache.core.distributions import first_version
from enginecache.core.lazyimport import import_backend
from enginecache.errors import BackendUnavailableError, IncompatibleEngineError, TargetError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:  # the contract (`base`: dataclasses, typing) is imported where a build or policy call needs it
    from collections.abc import Mapping
    from pathlib import Path
    from types import ModuleType
    from typing import Any

    from enginecache.core.backends.base import (
        BuildOutput,
        BuildSpec,
        CompatibilityResult,
        EngineRef,
        EngineSession,
        LoadSpec,
        LogCallback,
        ProgressCallback,
        Requirements,
    )
    from enginecache.core.backends.declaration import BackendDeclaration
    from enginecache.core.backends.headerfacts import HeaderFacts
    from enginecache.core.hostfingerprint import HostFingerprint

# EngineInvalidityDiagnostics bits, with the words we report for each.
_DIAGNOSTICS = {
    1: "the engine was built by a different TensorRT-RTX version",
    2: "this GPU's compute capability is not supported by the engine or by TensorRT-RTX",
    4: "the CUDA driver is too old",
    8: "the CUDA runtime is too old",
    16: "the GPU does not have enough memory",
    32: "the engine is malformed",
    64: "a CUDA error occurred while checking",
}


_MALFORMED = 32  # the diagnostics bit of a header the library cannot read as one of its engines


def describe_diagnostics(mask: int) -> list[str]:
    return [text for bit, text in _DIAGNOSTICS.items() if mask & bit]


class TensorRTBackend:
    """`rtx` (module tensorrt_rtx) or `trt` (module tensorrt)."""

    device = "gpu"
    precision_family = "tensorrt"  # strongly typed: int8/fp8 Q/DQ through NVIDIA ModelOpt's ONNX PTQ
    reads_files = False  # `deserialize_cuda_engine` takes memory: a load hands `load` the leased, verified mapping

    def __init__(self, name: str, declared: BackendDeclaration, label: str) -> None:
        self.name = name
        self.declaration = declared
        self.module = declared.library
        self.label = label
        # Both make TensorRT plans. Triton's TensorRT backend runs full TensorRT plans (first choice);
        # TensorRT-RTX plans need a TensorRT-RTX runtime (docs/runtime.md).
        self.triton = TritonInfo(
            platform="tensorrt_plan",
            backend=None,
            instance_kind="KIND_GPU",
            file_suffix=".plan",
            rank=1 if self.aot_targets else 0,
            warning=RTX_TRITON_WARNING if self.aot_targets else None,
        )

    def _trt(self) -> ModuleType:
        return import_backend(self.module, self.declaration.install_hint)

    def version(self) -> str:
        installed = first_version(self.declaration.distributions)
        if installed is not None:
            return installed
        return str(self._trt().__version__)

    @property
    def aot_targets(self) -> bool:
        """True for TensorRT-RTX, whose builder takes compute capabilities (no GPU needed)."""
        return self.module == "tensorrt_rtx"

    def default_targets(self, host: HostFingerprint) -> tuple[str, ...]:
        if self.aot_targets:
            return RTX_DEFAULT_TARGETS
        if not host.gpus:
            raise TargetError(f"{self.label} builds for the GPU it runs on, and this host has no NVIDIA GPU")
        return (host.gpus[0].compute_capability,)

    def resolve_targets(self, requested: tuple[str, ...], host: HostFingerprint) -> tuple[str, ...]:
        if self.aot_targets:
            return parse_rtx_targets(requested)
        from enginecache.core.backends.base import local_targets_only

        local = self.default_targets(host)
        return local_targets_only(
            local,
            parse_capabilities(requested) if requested else None,
            lambda asked: (
                f"{self.label} builds for the GPU it runs on: this host has {local[0]} "
                f"({host.gpus[0].name}); asked for {', '.join(asked)}. Build on a worker with that GPU."
            ),
        )

    # -- build --------------------------------------------------------------------------

    def build(
        self, spec: BuildSpec, output: Path, progress: ProgressCallback | None = None, log: LogCallback | None = None
    ) -> BuildOutput:
        from enginecache.core.backends.trt.build import build_plan

        trt = self._trt()
        with captured(trt, log) as (trt_logger, sink):
            return build_plan(
                trt, trt_logger, spec, output, progress, sink, label=self.label, aot_targets=self.aot_targets
            )

    # -- targets and policy ------------------------------------------------------------

    def known_targets(self) -> tuple[str, ...]:
        return RTX_COMPUTE_CAPABILITIES if self.aot_targets else ()

    def target_info(self, targets: tuple[str, ...], host: HostFingerprint) -> dict[str, Any]:
        if self.aot_targets:
            return {"compute_capabilities": list(targets)}
        gpu = next(g for g in host.gpus if g.compute_capability == targets[0])
        return {"compute_capability": targets[0], "gpu": gpu.name}

    def host_target(self, host: HostFingerprint) -> str:
        return ",".join(g.compute_capability for g in host.gpus) or "no-gpu"

    def show_targets(self, targets: tuple[str, ...]) -> str:
        return ",".join(targets).upper()

    def covers(self, targets: tuple[str, ...], host: HostFingerprint) -> bool:
        return any(g.compute_capability in targets for g in host.gpus)

    def dtype(self, native: Any) -> str:
        return dtype_name(native)

    def compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        """Loadable where this library is installed at the exact version that built the engine, on its
        OS, with an NVIDIA GPU whose compute capability is among the engine's targets."""
        from enginecache.core.backends.base import common_reasons, verdict

        built = f"built for {', '.join(t.upper() for t in engine.targets)} with {self.label} {engine.backend_version}"
        reasons, installed = common_reasons(engine, host, self.label, self.module)
        if not host.gpus:
            reasons.append(f"this host has no NVIDIA GPU ({host.nvml})")
        elif not self.covers(engine.targets, host):
            names = ", ".join(f"{g.name} ({g.compute_capability.upper()})" for g in host.gpus)
            reasons.append(f"this host's GPU {names} is not among the engine's targets")
        details: dict[str, Any] = {
            "targets": list(engine.targets),
            "backend_version": engine.backend_version,
            "installed_version": installed,
        }
        return verdict(built, reasons, details, "GPU and version match this host")

    def check_compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        """The rule, then (where the library is installed and the blob is local) TensorRT-RTX's own
        header check, whose diagnostic bits are added to the reasons."""
        from enginecache.core.backends.base import CompatibilityResult
        from enginecache.core.verdicts import Verdict

        rule = self.compatibility(engine, host)
        if engine.path is None:
            return rule
        try:
            trt = self._trt()
        except BackendUnavailableError as err:
            return CompatibilityResult(rule.verdict, rule.reason, {**rule.details, "error": str(err)})
        runtime = trt.Runtime(capturing_logger(trt))
        with open(engine.path, "rb") as stream:
            header = stream.read(_header_size(runtime))
        validity, mask = _header_validity(runtime, header)
        details = {
            **rule.details,
            "validity": validity,
            "diagnostics_mask": mask,
            "diagnostics": describe_diagnostics(mask),
        }
        built = rule.reason.split("; ", 1)[0]
        if not rule.compatible:
            extra = [d for d in describe_diagnostics(mask) if d not in rule.reason]
            return CompatibilityResult(Verdict.INCOMPATIBLE, "; ".join([rule.reason, *extra]), details)
        if validity == "INVALID":
            reasons = describe_diagnostics(mask) or [f"{self.label} reports the engine invalid on this host"]
            return CompatibilityResult(Verdict.INCOMPATIBLE, f"{built}; " + "; ".join(reasons), details)
        if validity == "SUBOPTIMAL":
            return CompatibilityResult(
                Verdict.COMPATIBLE, f"{built}; loadable, but {self.label} reports it suboptimal here", details
            )
        if validity is None:
            return CompatibilityResult(rule.verdict, rule.reason, details)
        validated = f"{built}; {self.label} validates the header on this GPU"
        return CompatibilityResult(Verdict.COMPATIBLE, validated, details)

    def build_requirements(self, target_info: Mapping[str, Any], backend_version: str, os_name: str) -> Requirements:
        """The exact library version and OS of the cache key; TensorRT also the GPU it builds for
        (TensorRT-RTX builds ahead of time for any listed compute capability, with no GPU)."""
        requirements: Requirements = {"backend": self.name, "backend_version": backend_version, "os": os_name}
        if not self.aot_targets:
            requirements["compute_capability"] = target_info["compute_capability"]
        return requirements

    def load_requirements(self, targets: tuple[str, ...]) -> Requirements:
        """A GPU of one of the engine's compute capabilities (TensorRT: the one it was built on)."""
        if self.aot_targets:
            return {"backend": self.name, "compute_capability_any": list(targets)}
        return {"backend": self.name, **({"compute_capability": targets[0]} if targets else {})}

    def describe_buildable(self, capabilities: Mapping[str, Any]) -> str:
        if self.aot_targets:
            return f"{self.name}: any of {', '.join(RTX_COMPUTE_CAPABILITIES)} (no GPU needed)"
        return self.describe_loadable(capabilities)

    def describe_loadable(self, capabilities: Mapping[str, Any]) -> str:
        gpus = [str(g.get("compute_capability")) for g in capabilities.get("gpus", [])]
        return f"{self.name}: " + (", ".join(gpus) if gpus else "nothing (no NVIDIA GPU)")

    def worker_build_requirements(self, requested: tuple[str, ...]) -> Requirements | None:
        """TensorRT builds for the GPU it runs on, so a host without it can plan the build for the live
        worker with the one GPU asked for. TensorRT-RTX builds ahead of time anywhere: None (plan it
        where it is installed)."""
        if self.aot_targets:
            return None
        wanted = parse_capabilities(requested)
        if len(wanted) != 1:
            raise TargetError("to build on a GPU worker instead, name its GPU with one --target (e.g. sm86)")
        return {"backend": self.name, "compute_capability": wanted[0]}

    # -- exports ------------------------------------------------------------------------

    def triton_cc_keys(self, targets: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(".".join(str(part) for part in sm_to_capability(t)) for t in targets)

    def hardware_names(self, targets: tuple[str, ...], target_info: Mapping[str, Any]) -> tuple[str, ...]:
        """TensorRT-RTX engines by SM; TensorRT engines by GPU model and SM (tuned on that GPU)."""
        if self.aot_targets:
            return targets
        gpu = str(target_info.get("gpu") or "gpu")
        return tuple(f"{gpu}-{t}" for t in targets)

    # -- load ---------------------------------------------------------------------------

    def prove_loadable(self, engine_path: Path, spec: LoadSpec, host: HostFingerprint) -> str:
        """Deserialize the plan where this host has a GPU among its targets; elsewhere (a build on a
        CPU, or for another GPU) nothing here can run it, and the note says so."""
        if not self.covers(spec.targets, host):
            gpus = ", ".join(g.compute_capability for g in host.gpus) or "no NVIDIA GPU"
            return f"not proven loadable here: this host has {gpus}, the engine targets {', '.join(spec.targets)}"
        self.load(engine_path.read_bytes(), spec).close()
        return f"proven loadable: {self.label} {self.version()} deserialized it on this host's GPU"

    def check_header(self, header: bytes, spec: LoadSpec, timer: PhaseTimer | None = None) -> None:
        """TensorRT-RTX's `get_engine_validity` on the header (64 bytes): INVALID raises
        IncompatibleEngineError with the library's diagnostic bits and its own log lines. TensorRT
        has no header check: nothing to refuse before deserializing."""
        trt = self._trt()
        with captured(trt) as (trt_logger, sink), (timer or PhaseTimer()).phase("validity"):
            runtime = trt.Runtime(trt_logger)
            self._refuse_invalid(runtime, bytes(header[: _header_size(runtime)]), spec, sink)

    def import_targets(self, requested: tuple[str, ...]) -> tuple[str, ...]:
        """The targets an import declares (`--target`), validated as a build's are; () where none are
        (TensorRT-RTX: the header says). TensorRT: any compute capability (the GPU it was built on)."""
        if not requested:
            return ()
        return parse_rtx_targets(requested) if self.aot_targets else parse_capabilities(requested)

    def import_target_info(self, targets: tuple[str, ...]) -> dict[str, Any]:
        """The cache key's target of an imported engine: a build's (`target_info`) where the targets
        say all of it; TensorRT's GPU model, which only the building host knew, is `UNKNOWN`."""
        if self.aot_targets:
            return {"compute_capabilities": list(targets)}
        from enginecache.core.cachekey import UNKNOWN

        if len(targets) == 1:
            return {"compute_capability": targets[0], "gpu": UNKNOWN}
        return {"compute_capabilities": list(targets), "gpu": UNKNOWN}

    def header_facts(self, header: bytes) -> HeaderFacts:
        """What the header proves on this host, GPU or none (`core.backends.headerfacts`): the library's
        own validity check where it has one (TensorRT-RTX's `get_engine_validity`; a header it calls
        malformed is refused), then, for TensorRT-RTX, the version that wrote it and the compute
        capabilities it was built for (`trt.header`). TensorRT's header is not read: its facts are declared."""
        from enginecache.core.backends.headerfacts import HeaderFacts
        from enginecache.core.backends.trt.header import TARGET_BITS, parse

        checks: dict[str, Any] = {}
        notes: list[str] = []
        try:
            trt = self._trt()
        except BackendUnavailableError:
            notes.append(f"{self.label} is not installed here: its own header check did not run")
        else:
            with captured(trt) as (trt_logger, sink):
                runtime = trt.Runtime(trt_logger)
                validity, mask = _header_validity(runtime, bytes(header[: _header_size(runtime)]))
            if validity is not None:
                library = [line for line in sink if "VERBOSE" not in line]
                diagnostics = describe_diagnostics(mask)
                checks = {"validity": validity, "diagnostics_mask": mask, "diagnostics": diagnostics}
                checks["library_log"] = library
                if mask & _MALFORMED:
                    said = f" [{self.label}: {' | '.join(library)}]" if library else ""
                    words = "; ".join(diagnostics)
                    refusal = f"{self.label}'s header check says it is not one of its engines: {words}{said}"
                    return HeaderFacts(checks=checks, refusal=refusal)
        if not self.aot_targets:
            notes.append(f"{self.label}'s header is not read here: its targets and version are declared")
            return HeaderFacts(checks=checks, notes=tuple(notes))
        parsed = parse(bytes(header))
        if parsed.problem is not None:
            return HeaderFacts(checks=checks, refusal=f"not a {self.label} plan: {parsed.problem}")
        if parsed.targets is None:
            notes.append(
                f"the header layout of {self.label} {parsed.version_text} is not known here: its targets are declared"
            )
        elif parsed.other_bits:
            notes.append(
                f"the header's target mask also has bits {parsed.other_bits:#x}, which name none of "
                + ", ".join(TARGET_BITS)
            )
        return HeaderFacts(
            format=f"{self.label} {parsed.version_text} plan",
            targets=parsed.targets,
            backend_version=parsed.version_text,
            checks=checks,
            notes=tuple(notes),
        )

    def _refuse_invalid(self, runtime: Any, header: bytes, spec: LoadSpec, sink: list[str]) -> None:
        validity, mask = _header_validity(runtime, header)
        if validity == "INVALID":
            library = [line for line in sink if "VERBOSE" not in line]
            reasons = describe_diagnostics(mask) or [f"{self.label} gives no diagnostic bit (mask 0)"]
            raise IncompatibleEngineError(
                f"{self.label} reports {spec.label} INVALID on this host: "
                + "; ".join(reasons)
                + (f" [{self.label}: {' | '.join(library)}]" if library else ""),
                {
                    "validity": validity,
                    "diagnostics_mask": mask,
                    "diagnostics": describe_diagnostics(mask),
                    "library_log": library,
                },
            )

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        """A `TensorRTEngineSession` on this host's GPU, from the verified bytes.

        TensorRT-RTX first checks the header (`get_engine_validity`, as `check_header`); INVALID raises
        IncompatibleEngineError carrying the library's diagnostic bits and its own log lines
        (on a host without a GPU: the CUDA error it met reading the GPU's properties).
        """
        timer = timer or PhaseTimer()
        trt = self._trt()
        with captured(trt) as (trt_logger, sink):  # the process-wide logger's sink is ours while we load
            with timer.phase("validity"):
                runtime = trt.Runtime(trt_logger)
                self._refuse_invalid(runtime, bytes(memoryview(engine)[: _header_size(runtime)]), spec, sink)
            # Only past the validity check: the session imports numpy (~0.1 s), which a refusal never needs.
            from enginecache.core.backends.trt.session import TensorRTEngineSession

            return TensorRTEngineSession(trt, runtime, engine, spec, timer, sink, self.name)

    def load_file(self, path: str, spec: LoadSpec, timer: PhaseTimer | None = None) -> EngineSession:
        """`load` of the file's bytes: TensorRT deserializes from memory (`reads_files` is False, so a
        load through `service.serving.engineload` hands `load` the verified bytes and never calls this)."""
        with open(path, "rb") as stream:
            return self.load(stream.read(), spec, timer)


def _header_size(runtime: Any) -> int:
    return int(getattr(runtime, "engine_header_size", 64))


def _header_validity(runtime: Any, header: bytes) -> tuple[str | None, int]:
    """TensorRT-RTX's header-only check: (VALID | SUBOPTIMAL | INVALID, diagnostics mask); None on TensorRT."""
    if not hasattr(runtime, "get_engine_validity"):
        return None, 0
    validity, mask = runtime.get_engine_validity(header)
    return str(getattr(validity, "name", validity)), int(mask)


# TensorRT-RTX plans are not TensorRT plans: Triton's stock `tensorrt` backend links TensorRT.
RTX_TRITON_WARNING = (
    "these are TensorRT-RTX plans: stock Triton Inference Server cannot load them (its tensorrt_plan "
    "backend runs TensorRT, not TensorRT-RTX); serve them with a Triton build whose TensorRT backend "
    "is built against TensorRT-RTX, or export the ONNX Runtime engine (--backend ort)"
)

RTX_BACKEND = TensorRTBackend("rtx", RTX, "TensorRT-RTX")
TRT_BACKEND = TensorRTBackend("trt", TRT, "TensorRT")
