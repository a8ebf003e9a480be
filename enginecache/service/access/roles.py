"""Who may do what: roles (viewer < operator < admin), the permission each action needs, and the
check every use case that changes something makes (`require`), with the actor in effect
(`audit.current_actor`).

- A *local* actor (`Actor.local`: the CLI's OS user, a worker or serving process, the dashboard when
  no login is configured, which then listens on 127.0.0.1 only) is the local admin: it has the files
  anyway. No catalog read is made for it.
- A logged-in user's role is their row in `user_roles` (by e-mail, lowercased); no row: no role,
  and every permission is denied (deny by default).

The check is made again on every call (nothing is cached), so a role taken away holds from the
user's next request on. Role changes are audited (`role.set`, `role.remove`).

Imports nothing beyond the stdlib and `service.access.audit` at module level (the dashboard's router imports
it on every run); the table is imported by the functions that read or write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TYPE_CHECKING

from enginecache.errors import AccessDeniedError, BadInputError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access.audit import Actor
from enginecache.service.context import AppContext

if TYPE_CHECKING:
    from enginecache.db.models import UserRoleRecord

SUBJECT_MAX = 320  # the longest e-mail address


class Role(StrEnum):
    """A user's role, ordered: viewer < operator < admin (each may do what the one below may)."""

    VIEWER = "viewer"
    OPERATOR = "operator"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        return _RANKS[self.value]

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return self.rank < other.rank

    def __le__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return self.rank <= other.rank

    def __gt__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return self.rank > other.rank

    def __ge__(self, other: object) -> bool:
        if not isinstance(other, Role):
            return NotImplemented
        return self.rank >= other.rank


_RANKS = {"viewer": 0, "operator": 1, "admin": 2}

# The least role each permission needs.
PERMISSIONS: dict[str, Role] = {
    "browse": Role.VIEWER,
    "download": Role.VIEWER,
    "upload": Role.OPERATOR,
    "build": Role.OPERATOR,
    "cancel": Role.OPERATOR,
    "test_load": Role.OPERATOR,
    "import": Role.OPERATOR,  # `engine import`: an engine built elsewhere
    "release": Role.OPERATOR,
    "retire": Role.ADMIN,
    "sign": Role.ADMIN,  # `verify --sign`: sign engines from before signing (core.signing)
    "delete": Role.ADMIN,
    "gc": Role.ADMIN,
    "backup": Role.ADMIN,
    "restore": Role.ADMIN,
    "server_path": Role.ADMIN,
    "roles": Role.ADMIN,
}


SUBJECT_SEPARATOR = "#"  # between a token's issuer and its subject: `https://idp.example#248289761001`
UNNAMED_LOGIN = "dashboard (login without a subject)"


def login_identity(claims: Mapping[str, object]) -> str:
    """Who a login is, from its identity token's claims: the e-mail where the provider says it is
    verified (`email_verified` true), else the subject as its issuer names it (`iss#sub`); never a
    display name or an unverified e-mail, which a user may set to anything. `UNNAMED_LOGIN` (no role
    can be granted to it) where the token has neither."""
    email, verified = claims.get("email"), claims.get("email_verified")
    if isinstance(email, str) and email.strip() and verified is True:
        return email.strip()
    subject, issuer = claims.get("sub"), claims.get("iss")
    if isinstance(subject, str) and subject:
        return f"{issuer}{SUBJECT_SEPARATOR}{subject}" if isinstance(issuer, str) and issuer else subject
    return UNNAMED_LOGIN


def normalize_subject(subject: str) -> str:
    """A user's key in `user_roles`: a verified e-mail stripped and lowercased, or an issuer's
    subject (`iss#sub`) stripped, its case kept (a subject is case-sensitive)."""
    stripped = subject.strip()
    return stripped if SUBJECT_SEPARATOR in stripped else stripped.lower()


def role_of(app: AppContext, actor: Actor) -> Role | None:
    """The actor's role: admin for a local actor; else the row of `user_roles` naming them, None
    where there is none (denied)."""
    if actor.local:
        return Role.ADMIN
    from enginecache.db.models import UserRoleRecord

    with app.catalog.read() as session:
        row = session.get(UserRoleRecord, normalize_subject(actor.name))
    return Role(row.role) if row is not None else None


def allowed(role: Role | None, permission: str) -> bool:
    """Whether `role` may do `permission` (a PERMISSIONS key; no role may do nothing)."""
    needed = PERMISSIONS[permission]
    return role is not None and role >= needed


def require(app: AppContext, permission: str) -> Role:
    """The current actor's role where it allows `permission`, else AccessDeniedError naming the
    user, their role and the role needed."""
    needed = PERMISSIONS[permission]
    actor = audit.current_actor()
    role = role_of(app, actor)
    if role is None or role < needed:
        has = f"role {role}" if role is not None else "no role"
        raise AccessDeniedError(
            f"{actor.name} ({has}) may not {permission.replace('_', '-')}: that needs the {needed} role or above"
        )
    return role


def _checked_subject(subject: str) -> str:
    key = normalize_subject(subject)
    if not key or len(key) > SUBJECT_MAX or any(c.isspace() or not c.isprintable() for c in key):
        raise BadInputError(
            f"{subject!r} is not a user: give their login's verified e-mail or its issuer#subject "
            f"(1-{SUBJECT_MAX} printable characters, no spaces)"
        )
    return key


def _checked_role(role: str | Role) -> Role:
    try:
        return Role(str(role).strip().lower())
    except ValueError:
        raise BadInputError(f"{role!r} is not a role: one of {', '.join(r.value for r in Role)}") from None


def set_role(app: AppContext, subject: str, role: str | Role) -> UserRoleRecord:
    """Give the user `subject` (their e-mail) `role`, replacing any role they had; recorded as
    `role.set` where it changed something."""
    from enginecache.db.models import UserRoleRecord, utcnow

    require(app, "roles")
    key, wanted = _checked_subject(subject), _checked_role(role)
    actor = audit.current_actor()
    with app.catalog.write() as session:
        row = session.get(UserRoleRecord, key)
        was = row.role if row is not None else None
        if row is None:
            row = UserRoleRecord(subject=key, role=wanted.value, granted_by=actor.name, granted_at=utcnow())
        elif row.role != wanted.value:
            row.role, row.granted_by, row.granted_at = wanted.value, actor.name, utcnow()
        session.add(row)
    if was != wanted.value:
        audit.record(app, audit.ROLE_SET, f"user {key}", {"role": wanted.value, "was": was})
    return row


def remove_role(app: AppContext, subject: str) -> UserRoleRecord:
    """Take the user's role away (they are denied from their next request on); recorded as
    `role.remove`. NotFoundError where they have none."""
    from enginecache.db.models import UserRoleRecord

    require(app, "roles")
    key = _checked_subject(subject)
    with app.catalog.write() as session:
        row = session.get(UserRoleRecord, key)
        if row is None:
            raise NotFoundError(f"{key} has no role to remove")
        session.delete(row)
    audit.record(app, audit.ROLE_REMOVE, f"user {key}", {"was": row.role})
    return row


def list_roles(app: AppContext) -> list[UserRoleRecord]:
    """Every user with a role, by subject."""
    from sqlmodel import col, select

    from enginecache.db.models import UserRoleRecord

    require(app, "roles")
    with app.catalog.read() as session:
        return list(session.exec(select(UserRoleRecord).order_by(col(UserRoleRecord.subject))).all())


def role_dict(row: UserRoleRecord) -> dict[str, str]:
    """A role row as `enginecache role ... --json` prints it (`granted_at` in ISO 8601, UTC)."""
    return {
        "subject": row.subject,
        "role": row.role,
        "granted_by": row.granted_by,
        "granted_at": row.granted_at.isoformat(),
    }
