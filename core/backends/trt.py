"""TensorRT and TensorRT for RTX behind one code path.

Both libraries share the Builder / OnnxParser / BuilderConfig / Runtime API. Where they differ
the difference is detected by `hasattr` on the loaded module or object, not by version strings:

| capability                        | tensorrt_rtx                     | tensorrt                       |
|-----------------------------------|----------------------------------|--------------------------------|
| build without a GPU               | yes (CPU-only AOT)               | no: builds for the local GPU   |
| target choice                     | `config.set_compute_capability`  | the GPU it runs on             |
| strongly typed network flag       | `STRONGLY_TYPED` (default typing)| `STRONGLY_TYPED` (TRT 10+)     |
| header validity check             | `Runtime.get_engine_validity`    | not available                  |

Precision is in the ONNX graph (core.precision): networks are built strongly typed, so no
FP16/INT8 builder flags are used (TensorRT 11 removed them).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from core.backends.base import (
    BuildOutput,
    BuildSpec,
    CompatibilityResult,
    EngineRef,
    LogCallback,
    ProgressCallback,
    ProgressEvent,
    TensorIO,
)
from core.backends.loader import import_backend
from core.errors import BackendUnavailableError, BuildError, TargetError
from core.fingerprint import HostFingerprint, package_version
from core.targets import RTX_DEFAULT_TARGETS, parse_capabilities, parse_rtx_targets

if TYPE_CHECKING:
    from core.session import EngineSession, LoadSpec, PhaseTimer

logger = logging.getLogger(__name__)

_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
    "FP8": "float8e4m3fn",
    "INT4": "int4",
    "FP4": "float4e2m1",
}

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

_BUILD_LOCK = threading.Lock()  # TensorRT keeps one process-wide logger: one build at a time
_LOGGERS: dict[str, Any] = {}


def _capturing_logger(trt: ModuleType) -> Any:
    """The process-wide logger for `trt`, created once, whose lines go to a swappable sink."""
    existing = _LOGGERS.get(trt.__name__)
    if existing is not None:
        return existing

    class CapturingLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.sink: list[str] = []
            self.listener: LogCallback | None = None

        def log(self, severity: Any, msg: str) -> None:
            name = getattr(severity, "name", str(severity))
            line = f"[{name}] {msg}"
            self.sink.append(line)
            if self.listener is not None:
                self.listener(line)
            if name in ("ERROR", "INTERNAL_ERROR"):
                logger.debug("%s: %s", trt.__name__, msg)

    instance = CapturingLogger()
    _LOGGERS[trt.__name__] = instance
    return instance


def _progress_monitor(trt: ModuleType, callback: ProgressCallback) -> Any:
    class Monitor(trt.IProgressMonitor):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            callback(ProgressEvent("start", phase_name, parent=parent_phase, steps=num_steps))

        def step_complete(self, phase_name: str, step: int) -> bool:
            callback(ProgressEvent("step", phase_name, step=step))
            return True

        def phase_finish(self, phase_name: str) -> None:
            callback(ProgressEvent("finish", phase_name))

    return Monitor()


def dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", str(dtype))
    return _DTYPES.get(name, name.lower())


def describe_diagnostics(mask: int) -> list[str]:
    return [text for bit, text in _DIAGNOSTICS.items() if mask & bit]


class TensorRTBackend:
    """`rtx` (module tensorrt_rtx) or `trt` (module tensorrt)."""

    def __init__(self, name: str, module: str, label: str) -> None:
        self.name = name
        self.module = module
        self.label = label

    def _trt(self) -> ModuleType:
        return import_backend(self.module)

    def version(self) -> str:
        installed = package_version(self.module)
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
        local = self.default_targets(host)
        if requested:
            wanted = parse_capabilities(requested)
            if wanted != local:
                raise TargetError(
                    f"{self.label} builds for the GPU it runs on: this host has {local[0]} "
                    f"({host.gpus[0].name}); asked for {', '.join(wanted)}. Build on a worker with that GPU."
                )
        return local

    # -- build --------------------------------------------------------------------------

    def build(
        self, spec: BuildSpec, output: Path, progress: ProgressCallback | None = None, log: LogCallback | None = None
    ) -> BuildOutput:
        trt = self._trt()
        with _captured(trt, log) as (trt_logger, sink):
            return self._build_locked(trt, trt_logger, spec, output, progress, sink)

    def _build_locked(
        self,
        trt: ModuleType,
        trt_logger: Any,
        spec: BuildSpec,
        output: Path,
        progress: ProgressCallback | None,
        sink: list[str],
    ) -> BuildOutput:
        trt_logger.min_severity = trt.Logger.VERBOSE if hasattr(trt.Logger, "VERBOSE") else None
        builder = trt.Builder(trt_logger)
        flags = 0
        creation = getattr(trt, "NetworkDefinitionCreationFlag", None)
        if creation is not None and hasattr(creation, "STRONGLY_TYPED"):
            flags |= 1 << int(creation.STRONGLY_TYPED)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, trt_logger)
        if not parser.parse_from_file(str(spec.onnx_path)):
            errors = [self._parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
            raise BuildError(
                f"{self.label} could not parse {spec.onnx_path.name}: " + "; ".join(errors or _errors(sink))
            )
        config = builder.create_builder_config()
        if self.aot_targets:
            config.num_compute_capabilities = len(spec.targets)
            for index, sm in enumerate(spec.targets):
                config.set_compute_capability(getattr(trt.ComputeCapability, sm.upper()), index)
        if spec.workspace_bytes is not None:
            config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_bytes)
        if spec.opt_level is not None:
            config.builder_optimization_level = spec.opt_level
        if progress is not None and hasattr(config, "progress_monitor"):
            config.progress_monitor = _progress_monitor(trt, progress)
        profile = builder.create_optimization_profile()
        dynamic = False
        for shapes in spec.profile.inputs:
            tensor = _network_input(network, shapes.name)
            if tensor is None:
                raise BuildError(f"profile names {shapes.name!r}, which the parsed network has no input for")
            if any(d < 0 for d in tensor.shape):
                profile.set_shape(shapes.name, shapes.min, shapes.opt, shapes.max)
                dynamic = True
        if dynamic:
            config.add_optimization_profile(profile)
        io = _network_io(network)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise BuildError(f"{self.label} failed to build {spec.onnx_path.name}: " + "; ".join(_errors(sink)))
        with open(output, "wb") as stream:
            stream.write(memoryview(serialized))
        del serialized
        return BuildOutput(engine_path=output, io=io, log="\n".join(sink))

    @staticmethod
    def _parser_error(error: Any) -> str:
        node_name = error.node_name() if hasattr(error, "node_name") else ""
        operator = error.node_operator() if hasattr(error, "node_operator") else ""
        where = f"node {node_name or error.node()}" + (f" ({operator})" if operator else "")
        return f"{where}: {error.desc()}"

    # -- compatibility ------------------------------------------------------------------

    def check_compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        built = f"built for {', '.join(t.upper() for t in engine.targets)} with {self.label} {engine.backend_version}"
        details: dict[str, Any] = {"targets": list(engine.targets), "backend_version": engine.backend_version}
        try:
            trt = self._trt()
        except BackendUnavailableError as err:
            return CompatibilityResult(
                "incompatible", f"{built}; {self.label} is not installed on this host", {**details, "error": str(err)}
            )
        installed = self.version()
        details["installed_version"] = installed
        runtime = trt.Runtime(_capturing_logger(trt))
        with open(engine.path, "rb") as stream:
            header = stream.read(_header_size(runtime))
        validity, mask = _header_validity(runtime, header)
        details["validity"] = validity
        details["diagnostics_mask"] = mask
        details["diagnostics"] = describe_diagnostics(mask)
        if not host.gpus:
            return CompatibilityResult("incompatible", f"{built}; this host has no NVIDIA GPU ({host.nvml})", details)
        reasons: list[str] = []
        if installed != engine.backend_version:
            reasons.append(f"this host has {self.label} {installed}, the engine needs {engine.backend_version}")
        unsupported = [g for g in host.gpus if g.compute_capability not in engine.targets]
        if len(unsupported) == len(host.gpus):
            names = ", ".join(f"{g.name} ({g.compute_capability.upper()})" for g in host.gpus)
            reasons.append(f"this host's GPU {names} is not among the engine's targets")
        reasons.extend(describe_diagnostics(mask))
        if validity == "INVALID" and not reasons:
            reasons.append(f"{self.label} reports the engine invalid on this host without a diagnostic")
        if reasons:
            return CompatibilityResult("incompatible", f"{built}; " + "; ".join(reasons), details)
        if validity == "SUBOPTIMAL":
            return CompatibilityResult(
                "compatible", f"{built}; loadable, but {self.label} reports it suboptimal here", details
            )
        if validity is None:
            return CompatibilityResult("compatible", f"{built}; GPU and version match this host", details)
        return CompatibilityResult("compatible", f"{built}; {self.label} validates the header on this GPU", details)

    # -- load ---------------------------------------------------------------------------

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        """A `TensorRTEngineSession` on this host's GPU, from the verified bytes.

        TensorRT-RTX first checks the header (`get_engine_validity`); INVALID raises
        IncompatibleEngineError carrying the library's diagnostic bits and its own log lines
        (on a host without a GPU: the CUDA error it met reading the GPU's properties).
        """
        from core.session import IncompatibleEngineError, PhaseTimer, TensorRTEngineSession

        timer = timer or PhaseTimer()
        trt = self._trt()
        with _captured(trt) as (trt_logger, sink):  # the process-wide logger's sink is ours while we load
            with timer.phase("validity"):
                runtime = trt.Runtime(trt_logger)
                validity, mask = _header_validity(runtime, bytes(memoryview(engine)[: _header_size(runtime)]))
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
            return TensorRTEngineSession(trt, runtime, engine, spec, timer, sink, self.name)


@contextlib.contextmanager
def _captured(trt: ModuleType, listener: LogCallback | None = None) -> Iterator[tuple[Any, list[str]]]:
    """The process-wide logger with a fresh sink (and listener) for one build or load; TensorRT keeps
    one logger per process, so builds and loads in a process take turns."""
    with _BUILD_LOCK:
        sink: list[str] = []
        trt_logger = _capturing_logger(trt)
        trt_logger.sink = sink
        trt_logger.listener = listener
        try:
            yield trt_logger, sink
        finally:
            trt_logger.sink = []
            trt_logger.listener = None


def _header_size(runtime: Any) -> int:
    return int(getattr(runtime, "engine_header_size", 64))


def _header_validity(runtime: Any, header: bytes) -> tuple[str | None, int]:
    """TensorRT-RTX's header-only check: (VALID | SUBOPTIMAL | INVALID, diagnostics mask); None on TensorRT."""
    if not hasattr(runtime, "get_engine_validity"):
        return None, 0
    validity, mask = runtime.get_engine_validity(header)
    return str(getattr(validity, "name", validity)), int(mask)


def _network_input(network: Any, name: str) -> Any:
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        if tensor.name == name:
            return tensor
    return None


def _network_io(network: Any) -> tuple[TensorIO, ...]:
    io: list[TensorIO] = []
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        io.append(TensorIO(tensor.name, "input", dtype_name(tensor.dtype), tuple(tensor.shape)))
    for index in range(network.num_outputs):
        tensor = network.get_output(index)
        io.append(TensorIO(tensor.name, "output", dtype_name(tensor.dtype), tuple(tensor.shape)))
    return tuple(io)


def _errors(sink: list[str]) -> list[str]:
    found = [line for line in sink if line.startswith(("[ERROR]", "[INTERNAL_ERROR]"))]
    return found or ["no error message from the library (see the builder log)"]


RTX_BACKEND = TensorRTBackend("rtx", "tensorrt_rtx", "TensorRT-RTX")
TRT_BACKEND = TensorRTBackend("trt", "tensorrt", "TensorRT")
