"""`enginecache audit`: the append-only log of changes (who, when, what, from where)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, OffsetOption, app_context, limit_option, stream_rows

DEFAULT_AUDIT_LIMIT = 100  # as service.access.audit.DEFAULT_LIMIT (not imported: `--help` loads no service code)


def _event_line(r: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    details = json.dumps(r["details"], sort_keys=True, default=str) if r["details"] else ""
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

    Each line: id, time (UTC), actor, origin, action, target and details. With --json, one JSON array.
    """
    from enginecache.service.access.audit import audit_dict, list_audit

    events = list_audit(app_context(ctx), action=action, limit=limit or DEFAULT_AUDIT_LIMIT, offset=offset or 0)
    stream_rows((audit_dict(e) for e in events), as_json, _event_line, "no audit events")


def register(app: typer.Typer) -> None:
    """Add `audit` to the CLI."""
    app.command("audit")(audit)
