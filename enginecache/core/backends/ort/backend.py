"""ONNX Runtime (CPU): the engine is the ORT-format model optimized for this CPU.

ORT's fully optimized (`ORT_ENABLE_ALL`) model may contain layout and fusion choices specific
to the CPU it was optimized on, so its target is the CPU architecture and ISA level.
"""

from __future__ import annotations

import os

from enginecache.core.backends.loadtypes import ENGINE_HEADER_BYTES, PhaseTimer, TritonInfo
from enginecache.core.backends.ort import ORT
from enginecache.core.backends.ort.dtypes import ort_dtype
from enginecache.core.backends.ort.errors import ort_errors
from enginecache.core.distributions import first_version
from enginecache.core.lazyimport import import_backend
from enginecache.core.targettext import split_requested
from enginecache.errors import BuildFailedError, IncompatibleEngineError

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
    from enginecache.core.backends.headerfacts import HeaderFacts
    from enginecache.core.hostfingerprint import HostFingerprint

# An ORT-format model is a flatbuffer whose file identifier (bytes 4..8) is "ORTM".
ORT_FORMAT_IDENTIFIER = b"ORTM"


class OnnxRuntimeBackend:
    name = "ort"
    label = "ONNX Runtime"
    declaration = ORT
    module = ORT.library
    device = "cpu"
    precision_family = "ort"  # int8/fp8 through onnxruntime.quantization
    reads_files = True  # InferenceSession(path): the memory of a load by hand (docs/runtime.md)
    # Triton's onnxruntime backend loads the ORT-format model; last choice when an export names no backend.
    triton = TritonInfo(
        platform="onnxruntime_onnx",
        backend="onnxruntime",
        instance_kind="KIND_CPU",
        file_suffix=".ort",
        rank=2,
        infer_output_shapes=True,
    )

    def _ort(self) -> ModuleType:
        return import_backend(ORT.library, ORT.install_hint)

    def version(self) -> str:
        return first_version(ORT.distributions) or str(self._ort().__version__)

    def default_targets(self, host: HostFingerprint) -> tuple[str, ...]:
        return (host.cpu_target,)

    def resolve_targets(self, requested: tuple[str, ...], host: HostFingerprint) -> tuple[str, ...]:
        from enginecache.core.backends.base import local_targets_only

        local = self.default_targets(host)
        wanted = split_requested(requested)
        return local_targets_only(
            local,
            wanted or None,
            lambda asked: (
                f"unknown target {', '.join(asked)!r} for ONNX Runtime: it optimizes for the CPU it runs on, "
                f"here {local[0]} (use --target cpu or omit --target)"
            ),
            alias=("cpu",),
        )

    def build(
        self, spec: BuildSpec, output: Path, progress: ProgressCallback | None = None, log: LogCallback | None = None
    ) -> BuildOutput:
        from enginecache.core.backends.base import BuildOutput, ProgressEvent

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
        except ort_errors(ort) as err:
            raise BuildFailedError(f"ONNX Runtime could not optimize {spec.onnx_path.name}: {err}") from err
        from enginecache.core.backends.ort.session import session_io  # numpy: imported where it runs

        io = session_io(session)
        if not output.is_file():
            raise BuildFailedError(f"ONNX Runtime wrote no optimized model for {spec.onnx_path.name}")
        if progress is not None:
            progress(ProgressEvent("finish", "Optimizing for this CPU"))
        text = f"ONNX Runtime {ort.__version__}: optimized {spec.onnx_path.name} with ORT_ENABLE_ALL (ORT format)"
        from enginecache.core.backends.ort.weights import low_precision_warning

        stored_at_fp32 = low_precision_warning(output, spec.precision)  # measured from the engine's weights
        warnings = (stored_at_fp32,) if stored_at_fp32 else ()
        text = "\n".join((text, *warnings))
        if log is not None:
            log(text)
        return BuildOutput(engine_path=output, io=io, log=text, warnings=warnings)

    def prove_loadable(self, engine_path: Path, spec: LoadSpec, host: HostFingerprint) -> str:
        """A session from the engine file's bytes, as a serving process makes one: ORT can write an
        ORT-format model it then refuses to read (e.g. a quantized graph's DequantizeLinear)."""
        self.load(engine_path.read_bytes(), spec).close()
        return f"proven loadable: ONNX Runtime {self.version()} made a session from the stored bytes"

    # -- targets and policy ------------------------------------------------------------

    def known_targets(self) -> tuple[str, ...]:
        return ()

    def target_info(self, targets: tuple[str, ...], host: HostFingerprint) -> dict[str, Any]:
        return {"cpu": targets[0]}

    def host_target(self, host: HostFingerprint) -> str:
        return host.cpu_target

    def show_targets(self, targets: tuple[str, ...]) -> str:
        return ",".join(targets)

    def covers(self, targets: tuple[str, ...], host: HostFingerprint) -> bool:
        return host.cpu_target in targets

    def dtype(self, native: Any) -> str:
        return ort_dtype(str(native))

    def compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        """Loadable where ONNX Runtime is installed at the version that wrote the ORT-format model (the
        format is tied to it), on the OS and the CPU target (architecture and ISA level) it was optimized for."""
        from enginecache.core.backends.base import common_reasons, verdict

        built = f"built for {', '.join(engine.targets)} with {self.label} {engine.backend_version}"
        reasons, installed = common_reasons(engine, host, self.label, self.module)
        if not self.covers(engine.targets, host):
            reasons.append(f"this host's CPU is {host.cpu_target}")
        details = {"installed_version": installed, "host_target": host.cpu_target}
        return verdict(built, reasons, details, "CPU and ONNX Runtime version match (ORT-format models are tied to it)")

    def check_compatibility(self, engine: EngineRef, host: HostFingerprint) -> CompatibilityResult:
        """The rule above; ONNX Runtime has no header check of its own beyond loading the model."""
        return self.compatibility(engine, host)

    def build_requirements(self, target_info: Mapping[str, Any], backend_version: str, os_name: str) -> Requirements:
        """The exact ONNX Runtime version and OS of the cache key, and the CPU target it optimizes for."""
        return {
            "backend": self.name,
            "backend_version": backend_version,
            "os": os_name,
            "cpu_target": target_info["cpu"],
        }

    def load_requirements(self, targets: tuple[str, ...]) -> Requirements:
        return {"backend": self.name, "cpu_target": targets[0] if targets else None}

    def describe_buildable(self, capabilities: Mapping[str, Any]) -> str:
        return f"{self.name}: {capabilities.get('cpu_target')}"

    def describe_loadable(self, capabilities: Mapping[str, Any]) -> str:
        return f"{self.name}: {capabilities.get('cpu_target')}"

    def worker_build_requirements(self, requested: tuple[str, ...]) -> Requirements | None:
        """None: ONNX Runtime is planned where it is installed (it is a core dependency)."""
        return None

    def triton_cc_keys(self, targets: tuple[str, ...]) -> tuple[str, ...]:
        return ()

    def hardware_names(self, targets: tuple[str, ...], target_info: Mapping[str, Any]) -> tuple[str, ...]:
        return targets

    def import_targets(self, requested: tuple[str, ...]) -> tuple[str, ...]:
        """The CPU target an import declares (`--target`, as `enginecache fingerprint` names one); at most one."""
        from enginecache.errors import TargetError

        targets = split_requested(requested)
        if len(targets) > 1:
            raise TargetError(f"an ONNX Runtime engine is made for one CPU target, not {', '.join(targets)}")
        return tuple(targets)

    def import_target_info(self, targets: tuple[str, ...]) -> dict[str, Any]:
        """The cache key's target of an imported engine, as a build's (`target_info`)."""
        return {"cpu": targets[0]}

    def header_facts(self, header: bytes) -> HeaderFacts:
        """An ORT-format model's file identifier (`check_header`'s first test): other bytes are refused.
        Neither the version that wrote it nor its CPU target is in the header: both are declared."""
        from enginecache.core.backends.headerfacts import HeaderFacts

        identifier = bytes(header[4:8])
        if identifier != ORT_FORMAT_IDENTIFIER:
            return HeaderFacts(
                refusal=f"not an ORT-format model (file identifier {identifier!r}, expected 'ORTM')",
                checks={"identifier": identifier.hex()},
            )
        notes = ("an ORT-format header names neither the ONNX Runtime version nor the CPU target: both are declared",)
        return HeaderFacts(format="ORT-format model", checks={"identifier": "ORTM"}, notes=notes)

    def check_header(self, header: bytes, spec: LoadSpec, timer: PhaseTimer | None = None) -> None:
        """The ORT-format identifier, and the ONNX Runtime version (ORT-format models are tied to the
        version that wrote them); reads the version from package metadata, imports nothing."""
        with (timer or PhaseTimer()).phase("validity"):
            identifier = bytes(header[4:8])
            if identifier != ORT_FORMAT_IDENTIFIER:
                raise IncompatibleEngineError(
                    f"{spec.label} is not an ORT-format model (file identifier {identifier!r}, expected 'ORTM')",
                    {"validity": "INVALID", "identifier": identifier.hex()},
                )
            installed = self.version()
            if spec.backend_version is not None and spec.backend_version != installed:
                raise IncompatibleEngineError(
                    f"{spec.label} was written by ONNX Runtime {spec.backend_version}; this host has {installed}",
                    {"validity": "INVALID", "installed_version": installed},
                )

    def load(
        self, engine: bytes | bytearray | memoryview, spec: LoadSpec, timer: PhaseTimer | None = None
    ) -> EngineSession:
        """An `OrtEngineSession` on the CPU, after `check_header` on the engine's first bytes."""
        from enginecache.core.backends.ort.session import OrtEngineSession  # numpy: imported where it runs

        timer = timer or PhaseTimer()
        ort = self._ort()
        self.check_header(bytes(memoryview(engine)[:ENGINE_HEADER_BYTES]), spec, timer)
        return OrtEngineSession(ort, engine, spec, timer)

    def load_file(self, path: str, spec: LoadSpec, timer: PhaseTimer | None = None) -> EngineSession:
        """An `OrtEngineSession` that ONNX Runtime reads from `path` itself, after `check_header` on
        the file's first bytes."""
        from enginecache.core.backends.ort.session import OrtEngineSession  # numpy: imported where it runs

        timer = timer or PhaseTimer()
        ort = self._ort()
        fd = os.open(path, os.O_RDONLY)
        try:
            header = os.pread(fd, ENGINE_HEADER_BYTES, 0)
        finally:
            os.close(fd)
        self.check_header(header, spec, timer)
        return OrtEngineSession(ort, path, spec, timer)


ORT_BACKEND = OnnxRuntimeBackend()
