"""`enginecache role set | remove | list`: who may do what on a dashboard with a login."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from enginecache.cli.common import JsonOption, add_group, app_context, emit, stream_rows

ROLES = "viewer, operator or admin"  # as service.access.roles.Role (not imported: `--help` loads no service code)
SubjectArgument = Annotated[
    str, typer.Argument(metavar="SUBJECT", help="The user's login e-mail (case does not matter).")
]


def _role_line(r: dict[str, Any]) -> str:
    from enginecache.service.readmodels.display import printable

    return printable(
        f"{r['subject']:<40} {r['role']:<9} by {r['granted_by']} at {r['granted_at'][:19].replace('T', ' ')}"
    )


def role_set(
    ctx: typer.Context,
    subject: SubjectArgument,
    role: Annotated[str, typer.Argument(metavar="ROLE", help=f"The role: {ROLES}.")],
    as_json: JsonOption = False,
) -> None:
    """Give a user a role (replacing the one they had): viewer < operator < admin."""
    from enginecache.service.access.roles import role_dict, set_role

    data = role_dict(set_role(app_context(ctx), subject, role))
    emit(data, as_json, _role_line(data))


def role_remove(ctx: typer.Context, subject: SubjectArgument, as_json: JsonOption = False) -> None:
    """Take a user's role away: they are denied everything from their next request on."""
    from enginecache.service.access.roles import remove_role, role_dict
    from enginecache.service.readmodels.display import printable

    data = role_dict(remove_role(app_context(ctx), subject))
    emit({**data, "removed": True}, as_json, printable(f"removed: {data['subject']} (was {data['role']})"))


def role_list(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Every user with a role, by subject; a user not listed is denied."""
    from enginecache.service.access.roles import list_roles, role_dict

    rows = list_roles(app_context(ctx))
    stream_rows((role_dict(r) for r in rows), as_json, _role_line, "no user has a role")


def register(app: typer.Typer) -> None:
    """Add the `role` group to the CLI."""
    add_group(
        app,
        "role",
        "Give dashboard users roles (viewer < operator < admin); deny by default.",
        {"set": role_set, "remove": role_remove, "list": role_list},
    )
