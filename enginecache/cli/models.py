"""`enginecache model add | list | show`: register and inspect ONNX models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, LimitOption, OffsetOption, app_context, emit, stream_rows


def model_add(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="ONNX file (external data files beside it are included).")],
    name: Annotated[str | None, typer.Option(help="Name in the catalog (default: file stem).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Inspect, hash and store an ONNX model; the same bytes twice return the existing model."""
    from enginecache.service.models import model_to_dict, register_model

    result = register_model(app_context(ctx), path, name=name)
    data = {**model_to_dict(result.model), "created": result.created}
    verb = "registered" if result.created else "already registered"
    emit(data, as_json, f"{verb}: {result.model.name} (id {result.model.id}) sha256 {result.model.digest}")


def _model_line(m: dict[str, Any]) -> str:
    return f"{m['id']:>4}  {m['name']:<32} {m['size_bytes']:>12,d} B  {m['digest'][:16]}"


def model_list(
    ctx: typer.Context, limit: LimitOption = None, offset: OffsetOption = None, as_json: JsonOption = False
) -> None:
    """Every model in the catalog, newest first."""
    from enginecache.service.listing import stream_models

    with stream_models(app_context(ctx), limit=limit, offset=offset or 0) as rows:
        stream_rows(rows, as_json, _model_line, "no models")


def model_show(
    ctx: typer.Context, model: Annotated[str, typer.Argument(help="Name, id or digest.")], as_json: JsonOption = False
) -> None:
    """Inputs/outputs with dynamic dims, opset, IR, producer, ops, parameters, files, digest."""
    from enginecache.service.listing import show_model

    data = show_model(app_context(ctx), model)
    emit(data, as_json, _model_text(data))


def _model_text(data: dict[str, Any]) -> str:
    """`model show` for people: the interface with readable shapes (the declared dims beside),
    what the graph is, and where its bytes are; --json has every field."""
    from enginecache.core.shapetext import shape_text

    opsets = ", ".join(f"{domain or 'ai.onnx'} {version}" for domain, version in data["opsets"].items())
    lines = [
        f"model {data['id']} {data['name']}: {data['filename']}, {data['size_bytes']:,} B, sha256 {data['digest']}",
        f"opset {opsets}; IR {data['ir_version']}"
        + (f"; producer {data['producer_name']} {data['producer_version']}".rstrip() if data["producer_name"] else ""),
        f"parameters {data['parameter_count']:,} ({data['parameter_bytes']:,} B)",
    ]
    if data.get("quantized"):
        lines.append(f"already quantized: {data['quantized']}")
    for mode in ("inputs", "outputs"):
        lines.append(f"{mode}:")
        for tensor in data[mode]:
            declared = [str(d) for d in tensor["shape"] if not isinstance(d, int)]
            note = f"  (declared: {', '.join(declared)})" if declared else ""
            lines.append(f"  {tensor['name']}: {tensor['dtype']} {shape_text(tensor['shape'])}{note}")
    ops = sorted(data["op_histogram"].items(), key=lambda item: (-item[1], item[0]))
    lines.append("ops: " + ", ".join(f"{count} {op}" for op, count in ops))
    if data["subgraph_op_histogram"]:
        inner = sorted(data["subgraph_op_histogram"].items(), key=lambda item: (-item[1], item[0]))
        lines.append("ops inside If/Loop/Scan bodies: " + ", ".join(f"{count} {op}" for op, count in inner))
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add the `model` group to the CLI."""
    group = typer.Typer(help="Register and inspect ONNX models.", no_args_is_help=True)
    group.command("add")(model_add)
    group.command("list")(model_list)
    group.command("show")(model_show)
    app.add_typer(group, name="model")
