"""ONNX Runtime (CPU): the engine is the ORT-format model optimized for this CPU.

ORT's fully optimized (`ORT_ENABLE_ALL`) model may contain layout and fusion choices specific
to the CPU it was optimized on, so its target is the CPU architecture and ISA level.
"""

from __future__ import annotations

import logging
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

if TYPE_CHECKING:
    from core.session import EngineSession, LoadSpec, PhaseTimer

logger = logging.getLogger(__name__)

# An ORT-format model is a flatbuffer whose file identifier (bytes 4..8) is "ORTM".
ORT_FORMAT_IDENTIFIER = b"ORTM"

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def ort_dtype(type_name: str) -> str:
    return _ORT_TYPES.get(type_name, type_name.removeprefix("tensor(").removesuffix(")"))


class OnnxRuntimeBackend:
    name = "ort"
    label = "ONNX Runtime"

    def _ort(self) -> ModuleType:
        return import_backend("onnxruntime")

    def version(self) -> str:
        return package_version("onnxruntime") or str(self._ort().__version__)

    def default_targets(self, host: HostFingerprint) -> tuple[str, ...]:
        return (host.cpu_target,)

    def resolve_targets(self, requested: tuple[str, ...], host: HostFingerprint) -> tuple[str, ...]:
        local = self.default_targets(host)
        wanted = tuple(p.strip() for value in requested for p in value.split(",") if p.strip())
        if wanted and wanted != local and wanted != ("cpu",):
            raise TargetError(
                f"unknown target {', '.join(wanted)!r} for ONNX Runtime: it optimizes for the CPU it runs on, "
                f"here {local[0]} (use --target cpu or omit --target)"
            )
        return local

    def build(
        self, spec: BuildSpec, output: Path, progress: ProgressCallback | None = None, log: LogCallback | None = None
    ) -> BuildOutput:
        ort = self._ort()
        if progress is not None:
            progress(ProgressEvent("start", "Optimizing for this CPU", steps=1))
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(output)
        options.add_session_config_entry("session.save_model_format", "ORT")
        options.log_severity_level = 3
        try:
            session = ort.InferenceSession(str(spec.onnx_path), options, providers=["CPUExecutionProvider"])
        except (RuntimeError, ValueError) as err:  # ORT raises its own subclasses of these
            raise BuildError(f"ONNX Runtime could not optimize {spec.onnx_path.name}: {err}") from err
        io = tuple(
            [TensorIO(t.name, "input", ort_dtype(t.type), _shape(t.shape)) for t in session.get_inputs()]
            + [TensorIO(t.name, "output", ort_dtype(t.type), _shape(t.shape)) for t in session.get_outputs()]
        )
        if not output.is_file():
            raise BuildError(f"ONNX Runtime wrote no optimized model for {spec.onnx_path.name}")
        if progress is not None:
            progress(ProgressEvent("finish", "Optimizing for this CPU"))
        text = f"ONNX Runtime {ort.__version__}: optimized {spec.onnx_path.name} with ORT_ENABLE_ALL (ORT format)"
        if log is not None:
            log(text)
        return BuildOutput(engine_path=output, io=io, log=text)

    def check_compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        built = f"built for {', '.join(engine.targets)} with ONNX Runtime {engine.backend_version}"
        try:
            installed = self.version()
            self._ort()
        except BackendUnavailableError as err:
            return CompatibilityResult(
                "incompatible", f"{built}; ONNX Runtime is not installed here", {"error": str(err)}
            )
        details: dict[str, Any] = {"installed_version": installed, "host_target": host.cpu_target}
        reasons = []
        if host.cpu_target not in engine.targets:
            reasons.append(f"this host's CPU is {host.cpu_target}")
        if installed != engine.backend_version:
            reasons.append(f"this host has ONNX Runtime {installed} (ORT-format models are tied to the version)")
        if reasons:
            return CompatibilityResult("incompatible", f"{built}; " + "; ".join(reasons), details)
        return CompatibilityResult("compatible", f"{built}; CPU and ONNX Runtime version match", details)

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        """An `OrtEngineSession` on the CPU. Validity: the ORT-format identifier, and the ONNX Runtime
        version (ORT-format models are tied to the version that wrote them)."""
        from core.session import IncompatibleEngineError, OrtEngineSession, PhaseTimer

        timer = timer or PhaseTimer()
        ort = self._ort()
        installed = self.version()
        with timer.phase("validity"):
            identifier = bytes(memoryview(engine)[4:8])
            if identifier != ORT_FORMAT_IDENTIFIER:
                raise IncompatibleEngineError(
                    f"{spec.label} is not an ORT-format model (file identifier {identifier!r}, expected 'ORTM')",
                    {"validity": "INVALID", "identifier": identifier.hex()},
                )
            if spec.backend_version is not None and spec.backend_version != installed:
                raise IncompatibleEngineError(
                    f"{spec.label} was written by ONNX Runtime {spec.backend_version}; this host has {installed}",
                    {"validity": "INVALID", "installed_version": installed},
                )
        return OrtEngineSession(ort, engine, spec, timer)


def _shape(shape: Any) -> tuple[int | str, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in shape)


ORT_BACKEND = OnnxRuntimeBackend()
