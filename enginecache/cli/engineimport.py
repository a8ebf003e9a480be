"""`enginecache engine import`: register an engine file built elsewhere against a registered model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import EXIT_BAD_INPUT, JsonOption, app_context, emit, fail


def engine_import(
    ctx: typer.Context,
    path: Annotated[
        Path,
        typer.Argument(
            metavar="PATH",
            help="The engine file (a TensorRT plan, ...), or a bundle folder (config.json, rank<N>.engine, ...).",
        ),
    ],
    model: Annotated[
        str | None,
        typer.Option("--model", help="The model it was built from: its name, NAME@ALIAS, an id or a digest."),
    ] = None,
    backend: Annotated[str | None, typer.Option("--backend", help="rtx | trt | ort")] = None,
    target: Annotated[
        list[str] | None,
        typer.Option("--target", help="Comma-separated: sm86,sm89 (default for rtx: what the header says)."),
    ] = None,
    precision: Annotated[str | None, typer.Option("--precision", help="fp32 | fp16 | bf16 | int8 | fp8")] = None,
    backend_version: Annotated[
        str | None, typer.Option("--backend-version", help="The library version that built it (e.g. 10.13.0).")
    ] = None,
    profile: Annotated[
        list[str] | None, typer.Option("--profile", help="INPUT=MIN,OPT,MAX it was built with, as for build.")
    ] = None,
    notes: Annotated[str | None, typer.Option("--notes", help="Free text kept with it (a CI run's URL).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Register an engine built elsewhere; UNPROVEN until a host that can run it loads it (test-load).

    A folder is an engine bundle (TensorRT-LLM's config.json and rank<N>.engine files, with any
    others beside them): every file is stored, and every rank engine's header checked.

    The file is copied into the store and hashed; what its header proves (TensorRT-RTX: the version
    and compute capabilities) is checked against what is declared, and a contradiction is refused
    (exit 2) naming both. Lookups and pull pass an UNPROVEN engine by until `enginecache test-load ID`
    passes on a host that can run it."""
    missing = [
        name for name, value in (("--model", model), ("--backend", backend), ("--precision", precision)) if not value
    ]
    if missing:
        fail(f"engine import needs {', '.join(missing)}", EXIT_BAD_INPUT)
    from enginecache.service.engines.bundles import import_engine_or_bundle
    from enginecache.service.engines.importing import ImportRequest

    request = ImportRequest(
        path=path,
        model=str(model),
        backend=str(backend),
        precision=str(precision),
        targets=tuple(target or ()),
        backend_version=backend_version,
        profiles=tuple(profile or ()),
        notes=notes or "",
    )
    result = import_engine_or_bundle(app_context(ctx), request)
    emit(result.to_dict(), as_json, _text(result.to_dict()))


def engine_confirm_load(
    ctx: typer.Context,
    engine_id: Annotated[int, typer.Argument(metavar="ENGINE_ID", help="The UNPROVEN engine a runtime loaded.")],
    path: Annotated[
        Path,
        typer.Argument(metavar="PATH", help="What the runtime loaded: the bundle's folder, or the engine file."),
    ],
    note: Annotated[str | None, typer.Option("--note", help="Free text kept with the proof (the server).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Record that a runtime on this host loaded an imported engine (TensorRT-LLM loading a bundle's
    folder, which test-load cannot): it becomes READY.

    Refused (nothing recorded) where the backend's rule says this host cannot load the engine
    (exit 1), or where PATH is not exactly the engine's bytes (exit 1); an engine that is not
    UNPROVEN or READY exits 2. Run it on the serving host once the server is ready."""
    from enginecache.service.engines.runtimeproof import confirm_runtime_load

    proof = confirm_runtime_load(app_context(ctx), engine_id, path, note=note or "")
    verb = f"is now {proof.status} (was {proof.was})" if proof.changed else f"is {proof.status} already"
    emit(proof.to_dict(), as_json, f"engine {engine_id} {verb}: loaded on {proof.host} ({proof.host_target})")


def _text(data: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    verb = "is already" if data["already"] else "imported as"
    lines = [
        f"{printable(str(data['model']))}: {verb} engine {data['id']} ({data['status']}), {data['backend']} "
        f"{data['backend_version'] or '(version unknown)'} {data['precision']} {','.join(data['targets'])}",
        f"sha256 {data['sha256']} ({data['size_bytes']:,} B)",
    ]
    if data["unknown"]:
        lines.append("unknown (left out of matching, never guessed): " + ", ".join(data["unknown"]))
    if data["status"] == "UNPROVEN":
        lines.append(f"lookups pass it by until a host that can run it loads it: enginecache test-load {data['id']}")
    return "\n".join(lines)
