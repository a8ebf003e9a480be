"""`enginecache gc`: remove from the store what the catalog no longer needs (docs/operations.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from enginecache.cli.common import EXIT_FAILED, JsonOption, app_context, emit

if TYPE_CHECKING:
    from enginecache.service.maintenance.gc.report import GcReport

KIND_WORDS = {
    "unreferenced_blob": "unreferenced blob",
    "retired_blob": "retired blob",
    "unreferenced_bundle": "unreferenced model",
    "temp": "temp",
}


def gc(
    ctx: typer.Context,
    apply: Annotated[
        bool,
        typer.Option("--apply", help="Remove, and mark PENDING engines whose build is gone FAILED (else: only list)."),
    ] = False,
    grace_days: Annotated[
        float | None,
        typer.Option(
            "--grace-days",
            min=0,
            metavar="N",
            help="Keep a retired engine's blob until N days after its last record (default 7).",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Remove unreferenced blobs, retired ones past the grace and stale temp folders (a dry run without --apply)."""
    from datetime import timedelta

    from enginecache.service.maintenance.gc.collect import collect_garbage
    from enginecache.service.maintenance.gc.report import GcPolicy

    policy = GcPolicy() if grace_days is None else GcPolicy(grace=timedelta(days=grace_days))
    report = collect_garbage(app_context(ctx), apply=apply, policy=policy)
    emit(report.to_dict(), as_json, _text(report))
    if not report.ok:
        raise typer.Exit(EXIT_FAILED)


def _text(report: GcReport) -> str:
    lines = []
    for r in report.removals:
        failed = f"  FAILED: {r.error}" if r.error else ""
        lines.append(f"{KIND_WORDS.get(r.kind, r.kind):<19} {r.path}  {_size(r.size_bytes)}  ({r.reason}){failed}")
    for a in report.abandoned:
        lines.append(f"{'PENDING -> FAILED':<19} engine {a.engine_id}  ({a.reason})")
    for k in report.kept:
        lines.append(f"{'kept':<19} {k.path}  ({k.reason})")
    verb, mark = ("removed", "marked") if report.applied else ("would remove", "would mark")
    done = sum(1 for r in report.removals if r.error is None)
    pending = len(report.abandoned)
    summary = f"{verb} {done} entries, {_size(report.size_bytes)}; {mark} {pending} PENDING engines FAILED"
    lines.append(summary if report.applied else f"{summary} (a dry run: add --apply to do it)")
    return "\n".join(lines)


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def register(app: typer.Typer) -> None:
    app.command("gc")(gc)
