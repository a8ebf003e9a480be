"""`enginecache release promote | rollback | list`: a model name's versions and aliases (prod, canary,
prod for one GPU class), as MLflow keeps them; `pull NAME@ALIAS` and the rest resolve them."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, add_group, app_context, emit, stream_rows

NameArgument = Annotated[str, typer.Argument(metavar="NAME", help="The model name.")]
AliasOption = Annotated[str, typer.Option("--alias", metavar="ALIAS", help="The alias, e.g. prod or canary.")]
GpuOption = Annotated[
    str | None,
    typer.Option("--gpu", metavar="CC", help="Only for hosts whose GPU is this compute capability (e.g. sm86)."),
]


def _target_line(t: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    scope = f" for {t['gpu_class']}" if t["gpu_class"] else ""
    return printable(f"{t['name']}@{t['alias']}{scope} -> version {t['version']} (model {t['model_id']})")


def release_promote(
    ctx: typer.Context,
    name: NameArgument,
    alias: AliasOption,
    version: Annotated[int | None, typer.Option(metavar="N", help="The version (default: the newest).")] = None,
    gpu: GpuOption = None,
    as_json: JsonOption = False,
) -> None:
    """Point an alias of the model at a version (operator)."""
    from enginecache.service.models.releases import promote

    data = promote(app_context(ctx), name, alias, version=version, gpu_class=gpu).to_dict()
    emit(data, as_json, _target_line(data))


def release_rollback(
    ctx: typer.Context, name: NameArgument, alias: AliasOption, gpu: GpuOption = None, as_json: JsonOption = False
) -> None:
    """Take the alias's last promote back: it points where it pointed before (operator)."""
    from enginecache.service.models.releases import rollback

    data = rollback(app_context(ctx), name, alias, gpu_class=gpu).to_dict()
    emit(data, as_json, _target_line(data))


def release_list(ctx: typer.Context, name: NameArgument, as_json: JsonOption = False) -> None:
    """Every alias of the model in effect, and the version each points at."""
    from enginecache.service.models.releases import aliases

    rows = aliases(app_context(ctx), name)
    stream_rows((t.to_dict() for t in rows), as_json, _target_line, f"model {name} has no aliases")


def register(app: typer.Typer) -> None:
    """Add the `release` group to the CLI."""
    add_group(
        app,
        "release",
        "Versions and aliases of a model: promote, roll back, list.",
        {"promote": release_promote, "rollback": release_rollback, "list": release_list},
    )
