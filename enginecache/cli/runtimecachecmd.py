"""`enginecache runtime-cache publish | list`: TensorRT-RTX runtime caches written back by serving
hosts, so the next host with the same GPU skips the kernel compile (docs/fleet.md, "Runtime caches")."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, add_group, app_context, emit, stream_rows


def _cache_line(c: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    return printable(
        f"runtime cache {c['id']}  engine {c['engine_id']}  {c['gpu_sku']} ({c['compute_capability']})  "
        f"TensorRT-RTX {c['rtx_version']}  CUDA {c['cuda_version']}  {c['size_bytes']} bytes  "
        f"{c['sha256'][:12]}  from {c['host']}"
    )


def runtime_cache_publish(
    ctx: typer.Context,
    engine_id: Annotated[int, typer.Argument(metavar="ENGINE_ID", help="The TensorRT-RTX engine the cache is for.")],
    file: Annotated[Path, typer.Argument(metavar="FILE", help="The serialized runtime cache.")],
    gpu: Annotated[str | None, typer.Option(metavar="SKU", help="The GPU's name (default: this host's).")] = None,
    compute_capability: Annotated[
        str | None, typer.Option("--cc", metavar="CC", help="e.g. sm89 (default: this host's).")
    ] = None,
    rtx_version: Annotated[
        str | None, typer.Option("--rtx-version", metavar="V", help="TensorRT-RTX version (default: installed).")
    ] = None,
    cuda_version: Annotated[
        str | None, typer.Option("--cuda-version", metavar="V", help="CUDA driver version (default: this host's).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Store a TensorRT-RTX runtime cache for an engine, keyed by GPU, compute capability and versions (operator)."""
    from enginecache.service.fleet.runtimecaches import publish_runtime_cache, runtime_cache_dict

    row = publish_runtime_cache(
        app_context(ctx),
        engine_id,
        file,
        gpu_sku=gpu,
        compute_capability=compute_capability,
        rtx_version=rtx_version,
        cuda_version=cuda_version,
    )
    data = runtime_cache_dict(row)
    emit(data, as_json, _cache_line(data))


def runtime_cache_list(
    ctx: typer.Context,
    engine_id: Annotated[int | None, typer.Option("--engine", metavar="ID", help="Only this engine's.")] = None,
    as_json: JsonOption = False,
) -> None:
    """Runtime caches in the catalog, newest first."""
    from enginecache.service.fleet.runtimecaches import list_runtime_caches, runtime_cache_dict

    rows = list_runtime_caches(app_context(ctx), engine_id)
    stream_rows((runtime_cache_dict(r) for r in rows), as_json, _cache_line, "no runtime caches")


def register(app: typer.Typer) -> None:
    """Add the `runtime-cache` group to the CLI."""
    add_group(
        app,
        "runtime-cache",
        "TensorRT-RTX runtime caches written back by serving hosts: publish, list.",
        {"publish": runtime_cache_publish, "list": runtime_cache_list},
    )
