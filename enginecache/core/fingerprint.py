"""The host fingerprint: OS, CPU and ISA, GPUs via NVML, driver, CUDA runtime, library versions.

Nothing here imports a GPU library at module import time. Versions of backend libraries come
from package metadata (no import); NVML and the CUDA runtime are asked lazily and their absence
is reported, not raised.
"""

from __future__ import annotations

import functools
import logging
import platform
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Distribution names whose versions matter to engine compatibility, keyed by the name we report.
_PACKAGES: dict[str, tuple[str, ...]] = {
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_cu13_libs", "tensorrt_cu12_libs"),
    "tensorrt_rtx": ("tensorrt-rtx", "tensorrt_rtx_cu13", "tensorrt_rtx_cu12"),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "onnx": ("onnx",),
    "cuda_python": ("cuda-python", "cuda-bindings"),
    "nvidia_ml_py": ("nvidia-ml-py",),
}

# ISA levels we name an ORT target by, best first.
_ISA_LEVELS: tuple[str, ...] = ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd")


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    compute_capability: str  # "sm86"
    memory_total_bytes: int


@dataclass(frozen=True)
class HostFingerprint:
    hostname: str
    os: str
    os_release: str
    machine: str
    python: str
    cpu_model: str
    cpu_isa: tuple[str, ...]
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cuda_runtime_version: str | None = None
    nvml: str = "unavailable"
    packages: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_isa"] = list(self.cpu_isa)
        data["gpus"] = [asdict(g) for g in self.gpus]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostFingerprint:
        """The inverse of `to_dict` (a worker's fingerprint as the catalog keeps it)."""
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["cpu_isa"] = tuple(data.get("cpu_isa") or ())
        fields["gpus"] = tuple(GpuInfo(**g) for g in data.get("gpus") or ())
        fields["packages"] = dict(data.get("packages") or {})
        return cls(**fields)

    @property
    def cpu_target(self) -> str:
        """The ORT target name for this CPU: `<machine>-<best ISA level>`."""
        return cpu_target(self.machine, self.cpu_isa)


def cpu_target(machine: str, isa: tuple[str, ...] | list[str]) -> str:
    flags = set(isa)
    best = next((level for level in _ISA_LEVELS if level in flags), "base")
    return f"{machine}-{best}"


def package_version(name: str) -> str | None:
    """The installed version of a backend library, by its reported name, without importing it."""
    for dist in _PACKAGES.get(name, (name,)):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def _cpu() -> tuple[str, tuple[str, ...]]:
    """CPU model and ISA flags. On Linux from /proc/cpuinfo (microseconds; py-cpuinfo spent 1.2-1.4 s
    here re-running Python and spawning `lscpu`, `dmesg` ...); elsewhere the platform's name, no flags."""
    return parse_cpuinfo(CPUINFO.read_text()) if CPUINFO.is_file() else (platform.processor() or "unknown", ())


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model, sorted flags) from /proc/cpuinfo's first processor block: x86 names them `model name`
    and `flags`, Arm `Hardware`/`CPU part` and `Features`."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or fields.get("hardware") or fields.get("processor") or platform.processor()
    flags = (fields.get("flags") or fields.get("features") or "").split()
    return model or "unknown", tuple(sorted(set(flags)))


def _nvml_gpus() -> tuple[str, tuple[GpuInfo, ...], str | None, str | None]:
    """(status, gpus, driver, cuda driver version) from NVML; status says why when empty."""
    try:
        import pynvml
    except ImportError:
        return "unavailable: nvidia-ml-py is not installed (pip install 'enginecache[gpu]')", (), None, None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return f"unavailable: {err} (no NVIDIA driver on this host)", (), None, None
    try:
        driver = _text(pynvml.nvmlSystemGetDriverVersion())
        cuda = pynvml.nvmlSystemGetCudaDriverVersion_v2()
        cuda_text = f"{cuda // 1000}.{(cuda % 1000) // 10}"
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            gpus.append(
                GpuInfo(
                    index=index,
                    name=_text(pynvml.nvmlDeviceGetName(handle)),
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    compute_capability=f"sm{major}{minor}",
                    memory_total_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                )
            )
        return "ok", tuple(gpus), driver, cuda_text
    except pynvml.NVMLError as err:
        return f"error: {err}", (), None, None
    finally:
        pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _cuda_runtime_version() -> str | None:
    """The CUDA runtime version through cuda-python, when it is installed and a driver answers."""
    try:
        from cuda.bindings import runtime
    except ImportError:
        return None
    err, version = runtime.cudaRuntimeGetVersion()
    if int(err) != 0:
        logger.debug("cudaRuntimeGetVersion failed: %s", err)
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


def host_fingerprint(*, probe_cuda_runtime: bool = False) -> HostFingerprint:
    """Fingerprint this host. `probe_cuda_runtime` imports cuda-python (a GPU library) to ask it."""
    cpu_model, isa = _cpu()
    nvml_status, gpus, driver, cuda_driver = _nvml_gpus()
    return HostFingerprint(
        hostname=platform.node(),
        os=platform.system(),
        os_release=platform.release(),
        machine=platform.machine(),
        python=platform.python_version(),
        cpu_model=cpu_model,
        cpu_isa=isa,
        gpus=gpus,
        driver_version=driver,
        cuda_driver_version=cuda_driver,
        cuda_runtime_version=_cuda_runtime_version() if probe_cuda_runtime else None,
        nvml=nvml_status,
        packages={name: package_version(name) for name in _PACKAGES},
    )
