"""`enginecache profiles MODEL` and `enginecache pull MODEL --dest DIR`: which of a model's engines fit
this host, and the one that does copied into a folder a serving process starts from (an init
container's step)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from enginecache.cli.common import EXIT_FAILED, MODEL_REF_HELP, JsonOption, app_context, emit

ModelArgument = Annotated[str, typer.Argument(metavar="MODEL", help=f"{MODEL_REF_HELP}.")]
PrecisionOption = Annotated[
    str | None,
    typer.Option(metavar="PRECISION", help="Only this precision (default: fp16, bf16, fp32, fp8, int8 in that order)."),
]
BackendOption = Annotated[
    str | None, typer.Option(metavar="BACKEND", help="Only this backend: the one the serving process loads with.")
]
EngineOption = Annotated[int | None, typer.Option("--engine", metavar="ID", help="Exactly this engine (pinned).")]
MaxBytesOption = Annotated[
    str | None,
    typer.Option(
        "--max-bytes",
        metavar="N",
        help="Keep the engines in DIR within N bytes (or 20G: K, M, G, T), evicting the least recently loaded "
        "ones no manifest names and no running process has loaded.",
    ),
]
AllowCpuOption = Annotated[
    bool,
    typer.Option("--allow-cpu", help="On a host with a GPU, take an engine for its CPU where none fits its GPU."),
]


def _wanted(backend: str | None, precision: str | None, engine: int | None, allow_cpu: bool) -> Any:
    from enginecache.service.fleet.profiles import Wanted

    return Wanted(backend=backend, precision=precision, engine_id=engine, allow_cpu=allow_cpu)


def _profile_line(p: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    mark = "*" if p["selected"] else " "
    engine = f"{p['engine_id']:>5}  {p['backend']:<4} {p['precision']:<5} {','.join(p['targets']):<24}"
    return printable(f"{mark} {engine} {p['verdict']:<12} {p.get('provenance', ''):<15} {p['reason']}")


def profiles(
    ctx: typer.Context,
    model: ModelArgument,
    backend: BackendOption = None,
    precision: PrecisionOption = None,
    engine: EngineOption = None,
    allow_cpu: AllowCpuOption = False,
    as_json: JsonOption = False,
) -> None:
    """Every engine of the model, compatible with this host or not and why; * marks the one pull takes."""
    from enginecache.service.fleet.profiles import model_profiles

    found = model_profiles(app_context(ctx), model, wanted=_wanted(backend, precision, engine, allow_cpu))
    data = found.to_dict()
    header = f"  {'engine':>5}  {'back':<4} {'prec':<5} {'targets':<24} {'verdict':<12} {'provenance':<15} reason"
    lines = (
        [header, *(_profile_line(p) for p in data["profiles"])]
        if data["profiles"]
        else [f"model {model} has no engines"]
    )
    emit(data, as_json, "\n".join(lines))
    if found.selected is None:
        raise typer.Exit(EXIT_FAILED)


def pull(
    ctx: typer.Context,
    model: ModelArgument,
    dest: Annotated[Path, typer.Option("--dest", metavar="DIR", help="The folder to pull into (a store of its own).")],
    backend: BackendOption = None,
    precision: PrecisionOption = None,
    engine: EngineOption = None,
    allow_cpu: AllowCpuOption = False,
    max_bytes: MaxBytesOption = None,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch",
            help="Keep pulling (a sidecar): each round re-resolves MODEL@ALIAS and, where it moved, pulls the new "
            "engine beside the old one and then replaces the manifest, which the serving process follows.",
        ),
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", metavar="S", min=0.0, help="With --watch: seconds between rounds.")
    ] = 30.0,
    rounds: Annotated[
        int | None, typer.Option("--rounds", metavar="N", min=1, help="With --watch: stop after N rounds.")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Copy the engine that fits this host into DIR, verified, with a manifest; resumable and idempotent."""
    from enginecache.service.fleet.pull import max_bytes_option
    from enginecache.service.fleet.pull import pull as pull_engine
    from enginecache.service.readmodels.display import printable

    budget = None if max_bytes is None else max_bytes_option(max_bytes)
    wanted = _wanted(backend, precision, engine, allow_cpu)
    if watch:
        _watch(ctx, model, dest, wanted, budget, interval, rounds, as_json)
        return
    result = pull_engine(app_context(ctx), model, dest, wanted=wanted, max_bytes=budget)
    done = "up to date" if result.up_to_date else f"pulled {result.copied_bytes} bytes"
    evicted = "" if result.evicted is None else f"; {result.evicted.describe()}"
    emit(
        result.to_dict(),
        as_json,
        printable(f"engine {result.engine_id}: {done} into {result.dest / result.manifest['blob']}{evicted}"),
    )


def _watch(
    ctx: typer.Context,
    model: str,
    dest: Path,
    wanted: Any,
    budget: int | None,
    interval: float,
    rounds: int | None,
    as_json: bool,
) -> None:
    """`pull --watch`: one line per round (a JSON object with --json), until --rounds or interrupted."""
    import json
    import threading

    from enginecache.cli.common import document_stream
    from enginecache.service.fleet.watch import WatchRound
    from enginecache.service.fleet.watch import watch as watch_alias
    from enginecache.service.readmodels.display import printable

    def report(done: WatchRound) -> None:
        if as_json:  # one JSON object a line (a round a line), so a reader follows it as it goes
            typer.echo(json.dumps(done.to_dict(), default=str), file=document_stream())
            return
        if done.result is None:
            line = f"round {done.round}: failed, the manifest left as it was: {done.error}"
        else:
            what = "pulled, manifest replaced" if done.switched else "up to date"
            line = f"round {done.round}: engine {done.result.engine_id} {what}"
        emit(done.to_dict(), False, printable(line))

    pause = threading.Event()  # never set: its wait is an interruptible sleep
    watch_alias(
        app_context(ctx),
        model,
        dest,
        wait=lambda: pause.wait(interval),
        rounds=rounds,
        wanted=wanted,
        max_bytes=budget,
        on_round=report,
    )


def register(app: typer.Typer) -> None:
    """Add `profiles` and `pull` to the CLI."""
    app.command()(profiles)
    app.command()(pull)
