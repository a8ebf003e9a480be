"""The host fingerprint: OS, CPU and ISA, GPUs via NVML, driver, CUDA runtime, library versions.

It runs in every serving start, so it is cheap in a new process (docs/runtime.md, "Host fingerprint"):

- CPU model and flags from the first block of /proc/cpuinfo (py-cpuinfo spent 1.2-1.4 s re-running
  Python and spawning `lscpu`, `dmesg`).
- Library versions from the `*.dist-info` folders on `sys.path`, read directly (what
  `importlib.metadata` finds, without importing it: that import alone costs ~35 ms), by
  `core.distributions`.
- NVML is asked once per process, and its answer is kept on disk (`host_gpus_cache_path()`) keyed
  by everything that changes it without a reboot being noticed: the boot id, the loaded NVIDIA
  driver (/proc/driver/nvidia/version), the NVIDIA device nodes, the visible-devices variables, the
  host name, and the nvidia-ml-py version. A changed host is never served a stale answer; a
  reboot, a driver reload or another container asks NVML again.
- A CPU backend's cache hit needs no GPU facts: `host_fingerprint(probe_gpus=False)` skips NVML.

Nothing here imports a GPU library at module import time; NVML and the CUDA runtime are asked
lazily and their absence is reported, not raised.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from enginecache.core.distributions import REPORTED_PACKAGES, package_version, path_index
from enginecache.core.distributions import distribution_version as distribution_version  # re-exported
from enginecache.core.valuetype import Frozen

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

    from enginecache.core.distributions import PathIndex

# ISA levels we name an ORT target by, best first.
_ISA_LEVELS: tuple[str, ...] = ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd")


class GpuInfo(Frozen):
    """One GPU as NVML reports it. (The fingerprint's types are `core.valuetype` values, not
    dataclasses: every serving start creates them; `replace(...)` is `dataclasses.replace`.)"""

    __slots__ = _fields = ("index", "name", "uuid", "compute_capability", "memory_total_bytes")

    index: int
    name: str
    uuid: str
    compute_capability: str  # "sm86"
    memory_total_bytes: int

    def __init__(self, index: int, name: str, uuid: str, compute_capability: str, memory_total_bytes: int) -> None:
        init = object.__setattr__
        init(self, "index", index)
        init(self, "name", name)
        init(self, "uuid", uuid)
        init(self, "compute_capability", compute_capability)
        init(self, "memory_total_bytes", memory_total_bytes)


class HostFingerprint(Frozen):
    __slots__ = _fields = (
        "hostname",
        "os",
        "os_release",
        "machine",
        "python",
        "cpu_model",
        "cpu_isa",
        "gpus",
        "driver_version",
        "cuda_driver_version",
        "cuda_runtime_version",
        "nvml",
        "packages",
    )

    hostname: str
    os: str
    os_release: str
    machine: str
    python: str
    cpu_model: str
    cpu_isa: tuple[str, ...]
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    cuda_driver_version: str | None
    cuda_runtime_version: str | None
    nvml: str
    packages: dict[str, str | None]

    def __init__(
        self,
        hostname: str,
        os: str,
        os_release: str,
        machine: str,
        python: str,
        cpu_model: str,
        cpu_isa: tuple[str, ...],
        gpus: tuple[GpuInfo, ...] = (),
        driver_version: str | None = None,
        cuda_driver_version: str | None = None,
        cuda_runtime_version: str | None = None,
        nvml: str = "unavailable",
        packages: dict[str, str | None] | None = None,
    ) -> None:
        init = object.__setattr__
        init(self, "hostname", hostname)
        init(self, "os", os)
        init(self, "os_release", os_release)
        init(self, "machine", machine)
        init(self, "python", python)
        init(self, "cpu_model", cpu_model)
        init(self, "cpu_isa", cpu_isa)
        init(self, "gpus", gpus)
        init(self, "driver_version", driver_version)
        init(self, "cuda_driver_version", cuda_driver_version)
        init(self, "cuda_runtime_version", cuda_runtime_version)
        init(self, "nvml", nvml)
        init(self, "packages", {} if packages is None else packages)

    def to_dict(self) -> dict[str, Any]:
        data = self.asdict()
        data["cpu_isa"] = list(self.cpu_isa)
        data["gpus"] = [g.asdict() for g in self.gpus]
        data["packages"] = dict(self.packages)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostFingerprint:
        """The inverse of `to_dict` (a worker's fingerprint as the catalog keeps it)."""
        fields = {k: v for k, v in data.items() if k in cls._fields}
        fields["cpu_isa"] = tuple(data.get("cpu_isa") or ())
        fields["gpus"] = tuple(GpuInfo(**g) for g in data.get("gpus") or ())
        fields["packages"] = dict(data.get("packages") or {})
        return cls(**fields)

    @property
    def cpu_target(self) -> str:
        """The ORT target name for this CPU: `<machine>-<best ISA level>`."""
        return cpu_target(self.machine, self.cpu_isa)


def _logger() -> Any:
    """This module's logger, on first use: `logging` costs a new process ~3 ms it rarely needs here."""
    import logging

    return logging.getLogger(__name__)


def cpu_target(machine: str, isa: tuple[str, ...] | list[str]) -> str:
    flags = set(isa)
    best = next((level for level in _ISA_LEVELS if level in flags), "base")
    return f"{machine}-{best}"


CPUINFO = Path("/proc/cpuinfo")


@functools.lru_cache(maxsize=1)
def _cpu() -> tuple[str, tuple[str, ...]]:
    """CPU model and ISA flags. On Linux from /proc/cpuinfo (microseconds; py-cpuinfo spent 1.2-1.4 s
    here re-running Python and spawning `lscpu`, `dmesg` ...); elsewhere the platform's name, no flags."""
    try:
        text = _first_block(CPUINFO)
    except OSError:
        return _processor() or "unknown", ()
    return parse_cpuinfo(text)


def _processor() -> str:
    import platform

    return platform.processor()


def _first_block(path: Path) -> str:
    """The file up to its first blank line: one processor's block (the kernel writes /proc/cpuinfo
    one processor at a time, so a 128-core host is not read whole)."""
    parts: list[str] = []
    with open(path, encoding="utf-8", errors="replace") as stream:
        while chunk := stream.read(4096):
            parts.append(chunk)
            if "\n\n" in chunk or "\n\n" in "".join(parts[-2:]):
                break
    return "".join(parts)


def parse_cpuinfo(text: str) -> tuple[str, tuple[str, ...]]:
    """(model, sorted flags) from /proc/cpuinfo's first processor block: x86 names them `model name`
    and `flags`, Arm `Hardware`/`CPU part` and `Features`."""
    fields: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip().lower(), value.strip())
    model = fields.get("model name") or fields.get("hardware") or fields.get("processor") or _processor()
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
        _logger().debug("cudaRuntimeGetVersion failed: %s", err)
        return None
    return f"{version // 1000}.{(version % 1000) // 10}"


# -- GPUs: NVML once per process, its answer kept on disk per host state ------------------------

HOST_GPUS_CACHE_ENV = "ENGINECACHE_HOST_CACHE"  # a file path, or "off"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
NVIDIA_DRIVER_VERSION = Path("/proc/driver/nvidia/version")
_VISIBLE_DEVICE_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
_GPU_CACHE_SCHEMA = 1


class GpuFacts(Frozen):
    """What NVML said: status ("ok", or why not), GPUs, driver and CUDA driver version."""

    __slots__ = _fields = ("nvml", "gpus", "driver_version", "cuda_driver_version")

    nvml: str
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    cuda_driver_version: str | None

    def __init__(
        self,
        nvml: str,
        gpus: tuple[GpuInfo, ...] = (),
        driver_version: str | None = None,
        cuda_driver_version: str | None = None,
    ) -> None:
        init = object.__setattr__
        init(self, "nvml", nvml)
        init(self, "gpus", gpus)
        init(self, "driver_version", driver_version)
        init(self, "cuda_driver_version", cuda_driver_version)

    def to_dict(self) -> dict[str, Any]:
        return {**self.asdict(), "gpus": [g.asdict() for g in self.gpus]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuFacts:
        return cls(
            nvml=str(data["nvml"]),
            gpus=tuple(GpuInfo(**g) for g in data.get("gpus") or ()),
            driver_version=data.get("driver_version"),
            cuda_driver_version=data.get("cuda_driver_version"),
        )


def read_boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id), or None where the OS has none."""
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def _nvidia_devices() -> list[str]:
    try:
        return sorted(name for name in os.listdir("/dev") if name.startswith("nvidia"))
    except OSError:
        return []


def gpu_state_key(index: PathIndex | None = None) -> dict[str, Any] | None:
    """Everything that changes NVML's answer on a running host without a reboot id telling: the
    loaded driver (its /proc version text), the device nodes this process sees (a container's
    share of the GPUs), the visible-devices variables, the host name, the NVML bindings' version.
    None where there is no boot id to anchor it (nothing is cached then)."""
    boot = read_boot_id()
    if boot is None:
        return None
    try:
        driver: str | None = NVIDIA_DRIVER_VERSION.read_text().strip()
    except OSError:
        driver = None
    return {
        "schema": _GPU_CACHE_SCHEMA,
        "boot_id": boot,
        "driver": driver,
        "devices": _nvidia_devices(),
        "env": {name: os.environ.get(name) for name in _VISIBLE_DEVICE_VARIABLES},
        "hostname": os.uname().nodename,
        "nvidia_ml_py": package_version("nvidia_ml_py", index=index),
    }


def host_gpus_cache_path() -> Path | None:
    """Where NVML's answer is kept: $ENGINECACHE_HOST_CACHE ("off": nowhere), else
    $XDG_CACHE_HOME/enginecache/host-gpus-<uid>.json (~/.cache by default)."""
    configured = os.environ.get(HOST_GPUS_CACHE_ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "0", "none") else Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(base) / "enginecache" / f"host-gpus-{uid}.json"


def _read_cached_gpus(path: Path, key: dict[str, Any]) -> GpuFacts | None:
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key:
            return None
        return GpuFacts.from_dict(data["facts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached_gpus(path: Path, key: dict[str, Any], facts: GpuFacts) -> None:
    """Atomically (temp file, rename); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            with open(temp, "w", encoding="utf-8") as stream:
                json.dump({"key": key, "facts": facts.to_dict()}, stream)
            os.replace(temp, path)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
    except OSError as err:
        _logger().debug("host GPU facts not cached at %s: %s", path, err)


@functools.lru_cache(maxsize=1)
def gpu_facts() -> GpuFacts:
    """NVML's answer for this host: asked once per process, and kept on disk while the host state
    (`gpu_state_key`) stands. A transient NVML error is not kept."""
    key = gpu_state_key(path_index())
    path = host_gpus_cache_path() if key is not None else None
    if path is not None and key is not None:
        cached = _read_cached_gpus(path, key)
        if cached is not None:
            return cached
    status, gpus, driver, cuda = _nvml_gpus()
    facts = GpuFacts(status, gpus, driver, cuda)
    if path is not None and key is not None and not status.startswith("error"):
        _write_cached_gpus(path, key, facts)
    return facts


def _system() -> tuple[str, str, str, str]:
    """(host name, OS, release, machine): os.uname() on POSIX (what platform.node/system/release/
    machine return there, without importing platform), platform's answers elsewhere."""
    if hasattr(os, "uname"):
        u = os.uname()
        return u.nodename, u.sysname, u.release, u.machine
    import platform

    return platform.node(), platform.system(), platform.release(), platform.machine()


def host_fingerprint(*, probe_cuda_runtime: bool = False, probe_gpus: bool = True) -> HostFingerprint:
    """Fingerprint this host. `probe_cuda_runtime` imports cuda-python (a GPU library) to ask it;
    `probe_gpus=False` leaves NVML out (no GPUs, `nvml` says so): for a CPU backend's cache hit."""
    cpu_model, isa = _cpu()
    index = path_index()
    gpus = gpu_facts() if probe_gpus else GpuFacts("not probed (a CPU backend's lookup)")
    hostname, os_name, release, machine = _system()
    return HostFingerprint(
        hostname=hostname,
        os=os_name,
        os_release=release,
        machine=machine,
        python=sys.version.split()[0],  # platform.python_version()
        cpu_model=cpu_model,
        cpu_isa=isa,
        gpus=gpus.gpus,
        driver_version=gpus.driver_version,
        cuda_driver_version=gpus.cuda_driver_version,
        cuda_runtime_version=_cuda_runtime_version() if probe_cuda_runtime else None,
        nvml=gpus.nvml,
        packages={name: package_version(name, index=index) for name in REPORTED_PACKAGES},
    )
