"""The machine a benchmark ran on (`machine_info`: CPU, memory, the work folder's mount and disk,
kernel, Python and the key libraries' versions), recorded beside every figure by bench/harness.py.
"""

from __future__ import annotations

import os
import platform
import shutil
from importlib import metadata
from pathlib import Path
from typing import Any

KEY_LIBRARIES = ("blake3", "numpy", "onnxruntime", "tensorrt-rtx", "onnx", "matplotlib")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mount_of(path: Path) -> dict[str, str]:
    """The /proc/mounts entry (device, mount point, file system type) that holds `path`."""
    best: dict[str, str] = {}
    target = str(path.resolve())
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return best
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        device, point, fstype = parts[0], parts[1], parts[2]
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best.get("mount_point", "")):
            best = {"device": device, "mount_point": point, "fs_type": fstype}
    return best


def _read_text(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


DAMON_KDAMONDS = Path("/sys/kernel/mm/damon/admin/kdamonds")


def damon_pageout() -> str | None:
    """The kernel's DAMON schemes that page memory out, where one runs: a running kdamond with a
    `pageout` scheme evicts memory (page cache included) not accessed for its minimum age, so a large
    file read once a minute is not in the page cache every time ("warm page cache" figures vary)."""
    found = []
    for scheme in sorted(DAMON_KDAMONDS.glob("*/contexts/*/schemes/*")):
        kdamond = scheme.parents[3]
        if _read_text(str(kdamond / "state")) != "on" or _read_text(str(scheme / "action")) != "pageout":
            continue
        age = _read_text(str(scheme / "access_pattern/age/min"))
        aggr_us = _read_text(str(scheme.parents[1] / "monitoring_attrs/intervals/aggr_us"))
        quota = _read_text(str(scheme / "quotas/bytes"))
        cold_s = int(age) * int(aggr_us) / 1e6 if age and aggr_us and age.isdigit() and aggr_us.isdigit() else None
        found.append(f"pageout of memory cold for {cold_s:g} s" if cold_s is not None else "pageout")
        every_ms = _read_text(str(scheme / "quotas/reset_interval_ms"))
        if quota and quota.isdigit() and int(quota):
            found[-1] += f" (at most {int(quota) / 2**20:g} MiB every {every_ms} ms)"
    return "; ".join(found) or None


def machine_info(work_dir: Path) -> dict[str, Any]:
    """The machine a figure ran on: CPU, cores, memory, the work dir's disk, kernel, Python, libraries."""
    versions: dict[str, str | None] = {}
    for name in KEY_LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    usage = shutil.disk_usage(work_dir)
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": _mem_total_bytes(),
        "disk": {
            **_mount_of(work_dir),
            "work_dir": str(work_dir),
            "total_bytes": usage.total,
            "free_bytes": usage.free,
        },
        "kernel": platform.release(),
        "transparent_hugepage": _read_text("/sys/kernel/mm/transparent_hugepage/enabled"),
        "damon_pageout": damon_pageout(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "libraries": versions,
        "loadavg_at_start": list(os.getloadavg()),
    }
