"""`enginecache audit`: the append-only log of changes (who, when, what, from where), and `audit
verify`, which checks its hash chain and its append-only triggers."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from enginecache.cli.common import (
    JsonOption,
    OffsetOption,
    app_context,
    emit,
    error_line,
    limit_option,
    stream_rows,
)
from enginecache.errors import EXIT_FAILED

DEFAULT_AUDIT_LIMIT = 100  # as service.access.audit.DEFAULT_LIMIT (not imported: `--help` loads no service code)


def _event_line(r: dict[str, Any]) -> str:
    from enginecache.service.access.auditdiff import readable_details
    from enginecache.service.readmodels.display import printable

    details = "; ".join(readable_details(r["action"], r["details"]).lines())  # old -> new first, as the view
    fields = (r["at"][:19].replace("T", " "), r["actor"], r["origin"], r["action"], r["target"], details)
    return printable(f"{r['id']:>6}  " + "  ".join(str(f) for f in fields))


def audit(
    ctx: typer.Context,
    action: Annotated[
        str | None, typer.Option("--action", metavar="ACTION", help="Only this action (e.g. engine.retire).")
    ] = None,
    limit: Annotated[int | None, limit_option(DEFAULT_AUDIT_LIMIT)] = None,
    offset: OffsetOption = None,
    as_json: JsonOption = False,
) -> None:
    """The audit log: every change, who made it, when and from where; newest first.

    Each line: id, time (UTC), actor, origin, action, target and details (what changed as
    `field: old -> new`, then `field: value`). With --json, one JSON array.
    `enginecache audit verify` checks that the log is whole.
    """
    if ctx.invoked_subcommand is not None:
        return
    from enginecache.service.access.audit import audit_dict, list_audit

    events = list_audit(app_context(ctx), action=action, limit=limit or DEFAULT_AUDIT_LIMIT, offset=offset or 0)
    stream_rows((audit_dict(e) for e in events), as_json, _event_line, "no audit events")


def audit_verify(
    ctx: typer.Context,
    head: Annotated[
        str | None,
        typer.Option(
            "--head",
            metavar="ID:HASH",
            help="A head kept elsewhere (a backup manifest's audit_head): the chain must hold that row with that hash.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Check the audit log: walk its hash chain and check its append-only triggers; exit 1 naming the first break.

    Finds a row deleted, edited or added beside the chain, rows cut from its end, and a trigger
    dropped or disabled. A chain rewritten consistently is found only against --head. With --json,
    one document (`ok`, `rows`, `last`, `head`, `broken`, `triggers`, `problems`), on failure too.
    """
    from enginecache.service.access.auditverify import parse_anchor, verify_audit

    result = verify_audit(app_context(ctx), anchor=parse_anchor(head) if head else None)
    chain = result.chain
    last = f"row {chain.last[0]}, hash {chain.last[1]}" if chain.last else "no rows"
    lines = [f"audit chain: {chain.rows} row(s) checked, last {last}"]
    lines.append("audit chain: intact" if chain.broken is None else f"audit chain: BROKEN: {chain.broken.message}")
    lines.append("triggers: in place" if not result.triggers else f"triggers: {len(result.triggers)} problem(s)")
    emit(result.to_dict(), as_json, "\n".join(lines))
    if not result.ok:
        for problem in result.problems():
            error_line(problem)
        raise typer.Exit(EXIT_FAILED)


def register(app: typer.Typer) -> None:
    """Add `audit` (the listing) and `audit verify` to the CLI."""
    group = typer.Typer(no_args_is_help=False)
    group.callback(invoke_without_command=True)(audit)
    group.command("verify")(audit_verify)
    app.add_typer(group, name="audit")
