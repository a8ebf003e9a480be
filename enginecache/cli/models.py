"""`enginecache model add | list | show`: register and inspect ONNX models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import (
    MODEL_REF_HELP,
    JsonOption,
    LimitOption,
    OffsetOption,
    add_group,
    app_context,
    emit,
    print_listing,
)


def model_add(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="ONNX file (external data files beside it are included).")],
    name: Annotated[
        str | None,
        typer.Option(help="Name in the catalog: letters, digits, '._-', not starting with '.' (default: file stem)."),
    ] = None,
    new_version: Annotated[
        bool, typer.Option("--new-version", help="These bytes become the newest model of a name already taken.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Inspect, hash and store an ONNX model; the same bytes twice return the existing model."""
    from enginecache.service.models.register import model_to_dict, register_model
    from enginecache.service.readmodels.display import printable

    app = app_context(ctx)
    result = register_model(app, path, name=name, new_version=new_version)
    data = {**model_to_dict(app, result.model), "created": result.created}
    verb = "registered" if result.created else "already registered"
    model = result.model
    version = f"@v{data['version']}" if data["version"] else ""
    emit(data, as_json, f"{verb}: {printable(model.name)}{version} (id {model.id}) sha256 {model.digest}")


# `model list`: the columns' names, then a row per model in the same widths (`_model_line`).
MODEL_HEADER = f"{'ID':>4}  {'NAME':<32} {'VERSION':<7}  {'ALIASES':<16} {'SIZE':>14}  SHA256"


def version_text(version: int | None) -> str:
    """A model's version as the listings show it: `v2`, or `-` for a converted variant."""
    return f"v{version}" if version else "-"


def aliases_text(aliases: list[dict[str, Any]]) -> str:
    """`prod, canary (sm86)`, or `-`."""
    return ", ".join(a["alias"] + (f" ({a['gpu_class']})" if a.get("gpu_class") else "") for a in aliases) or "-"


def _model_line(m: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    return (
        f"{m['id']:>4}  {printable(m['name']):<32} {version_text(m['version']):<7}  "
        f"{printable(aliases_text(m['aliases'])):<16} {m['size_bytes']:>12,d} B  {m['digest'][:16]}"
    )


def model_list(
    ctx: typer.Context, limit: LimitOption = None, offset: OffsetOption = None, as_json: JsonOption = False
) -> None:
    """Every model in the catalog, newest first, with its version and aliases."""
    from enginecache.service.readmodels.listing import stream_models

    listing = stream_models(app_context(ctx), limit=limit, offset=offset or 0)
    print_listing(listing, as_json, _model_line, "no models", header=MODEL_HEADER)


def model_show(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(metavar="MODEL", help=f"{MODEL_REF_HELP}.")],
    as_json: JsonOption = False,
) -> None:
    """Inputs/outputs with dynamic dims, opset, IR, producer, ops, parameters, files, digest."""
    from enginecache.service.readmodels.listing import show_model

    data = show_model(app_context(ctx), model)
    emit(data, as_json, _model_text(data))


def _model_text(data: dict[str, Any]) -> str:
    """`model show` for people: the interface with readable shapes (the declared dims beside),
    what the graph is, and where its bytes are; --json has every field. Every string that came
    from the uploaded file is shown with its control characters escaped (no forged lines)."""
    from enginecache.service.readmodels.display import printable, shape_text

    def text(key: str) -> str:
        return printable(str(data.get(key) or ""))

    opsets = ", ".join(f"{printable(d) or 'ai.onnx'} {v}" for d, v in (data.get("opsets") or {}).items())
    producer = " ".join(p for p in (text("producer_name"), text("producer_version")) if p)
    release = f"version {version_text(data.get('version'))}" if data.get("version") else "a converted variant"
    if data.get("aliases"):
        release += f", aliases {printable(aliases_text(data['aliases']))}"
    lines = [
        f"model {data['id']} {text('name')}: {text('filename')}, {data.get('size_bytes') or 0:,} B, "
        f"sha256 {data['digest']}",
        release,
        "; ".join(
            part
            for part in (
                f"opset {opsets}" if opsets else "",
                f"IR {data['ir_version']}" if data.get("ir_version") is not None else "",
                f"producer {producer}" if producer else "",
            )
            if part
        ),
    ]
    if data.get("parameter_count") is not None:
        lines.append(f"parameters {data['parameter_count']:,} ({data.get('parameter_bytes') or 0:,} B)")
    if data.get("quantized"):
        lines.append(f"already quantized: {printable(str(data['quantized']))}")
    for mode in ("inputs", "outputs"):
        lines.append(f"{mode}:")
        for tensor in data.get(mode) or []:
            shape = tensor.get("shape") or []
            declared = [printable(str(d)) for d in shape if not isinstance(d, int)]
            note = f"  (declared: {', '.join(declared)})" if declared else ""
            lines.append(f"  {printable(tensor['name'])}: {tensor.get('dtype')} {shape_text(shape)}{note}")
    for label, key in (("ops", "op_histogram"), ("ops inside If/Loop/Scan bodies", "subgraph_op_histogram")):
        ops = sorted((data.get(key) or {}).items(), key=lambda item: (-item[1], item[0]))
        if ops:
            lines.append(f"{label}: " + ", ".join(f"{count} {printable(op)}" for op, count in ops))
    return "\n".join(line for line in lines if line)


def register(app: typer.Typer) -> None:
    """Add the `model` group to the CLI."""
    add_group(
        app, "model", "Register and inspect ONNX models.", {"add": model_add, "list": model_list, "show": model_show}
    )
