"""`enginecache fingerprint`: what this host is, as the cache key and the worker routing see it."""

from __future__ import annotations

import typer

from enginecache.cli.common import JsonOption, emit


def fingerprint(as_json: JsonOption = False) -> None:
    """This host: OS, CPU and ISA, GPUs (NVML), driver, CUDA runtime, library versions."""
    from enginecache.service.fleet.thishost import this_host

    fp = this_host()
    data = fp.to_dict()
    gpus = "\n".join(
        f"  GPU {g.index}: {g.name} {g.compute_capability.upper()} {g.memory_total_bytes // 2**20} MiB ({g.uuid})"
        for g in fp.gpus
    )
    text = "\n".join(
        [
            f"host: {fp.hostname} ({fp.os} {fp.os_release}, {fp.machine}, Python {fp.python})",
            f"cpu: {fp.cpu_model} [{fp.cpu_target}]",
            f"gpus: {len(fp.gpus)}"
            + (
                f" (driver {fp.driver_version}, CUDA {fp.cuda_driver_version})"
                if fp.gpus
                else f" - no NVIDIA GPU: NVML {fp.nvml}"
            ),
            *([gpus] if gpus else []),
            f"cuda runtime: {fp.cuda_runtime_version or 'not available'}",
            "packages: " + ", ".join(f"{k} {v or 'not installed'}" for k, v in fp.packages.items()),
        ]
    )
    emit(data, as_json, text)


def register(app: typer.Typer) -> None:
    """Add `fingerprint` to the CLI."""
    app.command()(fingerprint)
