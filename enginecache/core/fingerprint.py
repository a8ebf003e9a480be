"""The host fingerprint: OS, CPU and ISA, GPUs via NVML, driver, CUDA runtime, library versions.

It runs in every serving start, so it is cheap in a new process (docs/runtime.md, "Host fingerprint"):

- CPU model and flags from the first block of /proc/cpuinfo (no subprocess: py-cpuinfo re-runs
  Python and spawns `lscpu` and `dmesg`).
- Library versions from the `*.dist-info` folders on `sys.path`, read directly (what
  `importlib.metadata` finds, without importing it), by
  `core.distributions`.
- GPUs, driver and CUDA driver version come from `core.gpufacts.gpu_facts()`: NVML asked once per
  process, its answer kept on disk per host state (boot id, loaded driver, device nodes, ...).
- A CPU backend's cache hit needs no GPU facts: `host_fingerprint(probe_gpus=False)` skips NVML.

Nothing here imports a GPU library at module import time; NVML and the CUDA runtime are asked
lazily and their absence is reported, not raised.
"""

from __future__ import annotations

import functools
import os
import sys

from enginecache.core.backends.registry import declarations
from enginecache.core.distributions import REPORTED_PACKAGES, first_version, package_version, path_index
from enginecache.core.distributions import distribution_version as distribution_version  # re-exported
from enginecache.core.gpufacts import GpuFacts as GpuFacts  # re-exported
from enginecache.core.gpufacts import GpuInfo as GpuInfo  # re-exported
from enginecache.core.gpufacts import gpu_facts as gpu_facts  # re-exported; host_fingerprint calls it by this name
from enginecache.core.hostfingerprint import HostFingerprint as HostFingerprint  # re-exported
from enginecache.core.hostfingerprint import cpu_target as cpu_target  # re-exported

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any


def _logger() -> Any:
    """This module's logger, on first use: a serving start that logs nothing does not import `logging`."""
    import logging

    return logging.getLogger(__name__)


CPUINFO = "/proc/cpuinfo"


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


def _first_block(path: str | os.PathLike[str]) -> str:
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
        packages={
            **{d.library: first_version(d.distributions, index=index) for d in declarations()},
            **{name: package_version(name, index=index) for name in REPORTED_PACKAGES},
        },
    )
