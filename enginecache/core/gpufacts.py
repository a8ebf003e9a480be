"""The host's GPU facts: what NVML says (GPUs, driver, CUDA driver version), asked once per process
and kept on disk per host state.

Its one job is `gpu_facts()` (the GPU part of `core.fingerprint.host_fingerprint`): NVML's answer,
kept in `host_gpus_cache_path()` under a key (`gpu_state_key`) of everything that changes it without
a reboot being noticed: the boot id, the loaded NVIDIA driver (/proc/driver/nvidia/version), the
NVIDIA device nodes, the visible-devices variables, the host name, and the nvidia-ml-py version. A
changed host is never served a stale answer; a reboot, a driver reload or another container asks
NVML again, and a transient NVML error is not kept.

Nothing here imports a GPU library at module import time: `pynvml` is imported when NVML is asked,
and its absence is reported, not raised.
"""

from __future__ import annotations

import functools
import json
import os

from enginecache.core.distributions import package_version, path_index
from enginecache.core.valuetype import Frozen

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

    from enginecache.core.distributions import PathIndex

HOST_GPUS_CACHE_ENV = "ENGINECACHE_HOST_CACHE"  # a file path, or "off"
# Paths are strings here: the fingerprint is part of every cache hit, which imports no pathlib (core.pathtext).
BOOT_ID = "/proc/sys/kernel/random/boot_id"
NVIDIA_DRIVER_VERSION = "/proc/driver/nvidia/version"
_VISIBLE_DEVICE_VARIABLES = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
_GPU_CACHE_SCHEMA = 1


class GpuInfo(Frozen):
    """One GPU as NVML reports it. (The fingerprint's types are `core.valuetype` values, not
    dataclasses: every serving start creates them; `replace(...)` is `dataclasses.replace`.)"""

    index: int
    name: str
    uuid: str
    compute_capability: str  # "sm86"
    memory_total_bytes: int


class GpuFacts(Frozen):
    """What NVML said: status ("ok", or why not), GPUs, driver and CUDA driver version."""

    nvml: str
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None

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


def _logger() -> Any:
    """This module's logger, on first use: a serving start that logs nothing does not import `logging`."""
    import logging

    return logging.getLogger(__name__)


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


# -- NVML's answer kept on disk per host state --------------------------------------------------


def read_boot_id() -> str | None:
    """This boot's id (/proc/sys/kernel/random/boot_id), or None where the OS has none."""
    try:
        return _read_text(BOOT_ID).strip() or None
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
        driver: str | None = _read_text(NVIDIA_DRIVER_VERSION).strip()
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


def _read_text(path: str | os.PathLike[str]) -> str:
    with open(path, encoding="utf-8") as stream:
        return stream.read()


def host_gpus_cache_path() -> str | None:
    """Where NVML's answer is kept: $ENGINECACHE_HOST_CACHE ("off": nowhere), else
    $XDG_CACHE_HOME/enginecache/host-gpus-<uid>.json (~/.cache by default)."""
    configured = os.environ.get(HOST_GPUS_CACHE_ENV)
    if configured is not None:
        return None if configured.strip().lower() in ("", "off", "0", "none") else configured
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return os.path.join(base, "enginecache", f"host-gpus-{uid}.json")


def _read_cached_gpus(path: str, key: dict[str, Any]) -> GpuFacts | None:
    try:
        data = json.loads(_read_text(path))
        if data.get("key") != key:
            return None
        return GpuFacts.from_dict(data["facts"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached_gpus(path: str, key: dict[str, Any], facts: GpuFacts) -> None:
    """Atomically (temp file, rename); a cache that cannot be written is skipped."""
    try:
        folder, name = os.path.split(path)
        if folder:
            os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{name}.{os.getpid()}.tmp")
        try:
            with open(temp, "w", encoding="utf-8") as stream:
                json.dump({"key": key, "facts": facts.to_dict()}, stream)
            os.replace(temp, path)
        except BaseException:
            if os.path.lexists(temp):
                os.unlink(temp)
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
