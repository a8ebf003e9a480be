"""The audit log: who changed what, when, and from where (`audit_events`, append-only at the database).

Each use case that changes the catalog or the store calls `record` right after the change succeeded,
in a short write transaction of its own, through the audit chain's one writer (`db.auditchain`;
`service.access.auditverify` checks the chain) (an audit row never holds the change's transaction open, and
a change that failed is never recorded). A failure to write the row raises: the change stands, and
the caller learns that its record is missing. Changes of an engine's status are the exception: the
engine-lifecycle gateway (`db.engines`) writes their row in the change's own transaction, as the
actor the caller names (`current_actor()`).

Who acts is the `Actor` in effect (`acting_as`), a context variable, so each thread, asyncio task and
Streamlit script run has its own:

- the CLI, and any process that names nobody, acts as the local OS user (`local_actor`: the local
  admin, origin `cli <hostname> pid <pid>`, `local=True`);
- the dashboard sets the Streamlit user at the top of each script run (`dashboard.app`), and names
  them through `use_actor_source` too: a Streamlit fragment's own reruns run in a new thread without
  the script that set the variable;
- a job's child process acts as the job's submitter (`job_actor`), from its worker: a job records who
  enqueued it (`jobs.submitted_by`).

Imports nothing beyond the stdlib and `db.engines` (stdlib alone) at module level (the dashboard's
router imports it on every run); the table is imported by the functions that read or write it.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import socket
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enginecache.db import engines
from enginecache.service.context import AppContext

if TYPE_CHECKING:
    from enginecache.db.models import AuditEventRecord

# Actions (`audit_events.action`): `<what>.<verb>`.
MODEL_REGISTER = "model.register"
MODEL_REPAIR = "model.repair"  # bytes already registered: the damaged stored bundle rewritten, or set OK again
MODEL_CORRUPT = "model.corrupt"  # a re-hash found the stored bundle changed: marked CORRUPT
MODEL_OK = "model.ok"  # a CORRUPT model's stored bundle hashes to its digest again: marked OK
BUILD_SUBMIT = "build.submit"  # a build job enqueued (not a cache hit, not a join of an active job)
BUILD_RUN = "build.run"  # an engine built in the calling process (build_engine; load_or_build on a miss)
JOB_CANCEL = "job.cancel"
TEST_LOAD_SUBMIT = "test_load.submit"
# A change of an engine's status is audited by `db.engines`, in the change's own transaction.
ENGINE_RETIRE = engines.ENGINE_RETIRE
ENGINE_CORRUPT = engines.ENGINE_CORRUPT  # verify, check, a test-load or a serving load found the blob changed
ENGINE_READY = engines.ENGINE_READY  # verify found a CORRUPT engine's blob whole again: READY
ENGINE_DELETE = "engine.delete"  # retired and its blob removed now (where nothing else needs it)
GC_APPLY = "gc.apply"  # `gc --apply` removed what the catalog no longer needs
CATALOG_BACKUP = "catalog.backup"
CATALOG_RESTORE = "catalog.restore"  # recorded in the restored catalog
MODEL_SERVER_PATH = "model.server_path"  # the dashboard registered a file from the server's filesystem
RELEASE_PROMOTE = "release.promote"  # an alias pointed at a model version
RELEASE_ROLLBACK = "release.rollback"  # an alias's last promote taken back
ROLE_SET = "role.set"  # a user granted a role (or their role changed)
ROLE_REMOVE = "role.remove"  # a user's role taken away: they are denied from then on

DEFAULT_LIMIT = 100


@dataclass(frozen=True)
class Actor:
    """Who makes a change (`name`: an OS user, a login's e-mail) and from where (`origin`), and
    whether they act from this machine (`local`: the OS user of the CLI, a worker or serving process,
    the dashboard without a login, all the local admin) or as a logged-in user, whose role the
    catalog's `user_roles` names (`service.access.roles`). An actor is not local unless it says so."""

    name: str
    origin: str
    local: bool = False


def local_actor() -> Actor:
    """This process's OS user, origin `cli <hostname> pid <pid>` (the pid of the caller, a forked
    child's own). A uid without a name (a container's) is named `uid <n>`."""
    try:
        name = getpass.getuser()
    except (KeyError, OSError):  # no login name in the environment and no passwd entry for the uid
        name = f"uid {os.getuid()}"
    return Actor(name, f"cli {socket.gethostname()} pid {os.getpid()}", local=True)


def job_actor(submitted_by: str | None, job_id: int) -> Actor:
    """Whom a worker acts as while it runs job `job_id`: its submitter (`jobs.submitted_by`, the name
    `current_actor` gave when it was enqueued; this process's OS user for a job that names nobody),
    from `worker <hostname> pid <pid> job <id>`. The authority is the worker's own (`local`): the
    submitter's role was checked when the job was enqueued, and a role taken away since does not
    strand the work it allowed."""
    name = submitted_by if submitted_by else local_actor().name
    return Actor(name, f"worker {socket.gethostname()} pid {os.getpid()} job {job_id}", local=True)


ActorSource = Callable[[], "Actor | None"]

_acting: ContextVar[Actor | None] = ContextVar("enginecache_acting_actor", default=None)
_source: ActorSource | None = None


@contextlib.contextmanager
def acting_as(actor: Actor) -> Iterator[Actor]:
    """Changes made in this block (this thread or task) are recorded as `actor`'s."""
    token = _acting.set(actor)
    try:
        yield actor
    finally:
        _acting.reset(token)


def use_actor_source(source: ActorSource | None) -> None:
    """Where `current_actor` asks when no `acting_as` is in effect, before the OS user: a program
    acting for other people (the dashboard) names the person for code its entry point does not wrap.
    `source` answers None where it knows nobody (a thread that is no Streamlit script run). None
    removes it."""
    global _source
    _source = source


def current_actor() -> Actor:
    """The `acting_as` actor in effect, else the actor source's answer, else the local OS user."""
    actor = _acting.get()
    if actor is None and _source is not None:
        actor = _source()
    return actor if actor is not None else local_actor()


def record(app: AppContext, action: str, target: str, details: dict[str, Any] | None = None) -> AuditEventRecord:
    """Append one event for the current actor (its own write transaction, through the audit chain's
    one writer, `db.auditchain.append`) and return it."""
    from datetime import UTC, datetime

    from enginecache.db import auditchain
    from enginecache.db.models import AuditEventRecord

    actor, at, details = current_actor(), datetime.now(UTC), details or {}
    with app.catalog.changes() as ex:
        event_id, digest = auditchain.append(
            ex,
            at=ex.timestamp(at),
            actor=actor.name,
            origin=actor.origin,
            action=action,
            target=target,
            details=details,
        )
    return AuditEventRecord(
        id=event_id,
        at=at,
        actor=actor.name,
        origin=actor.origin,
        action=action,
        target=target,
        details=details,
        row_hash=digest,
    )


def list_audit(
    app: AppContext, *, action: str | None = None, limit: int | None = DEFAULT_LIMIT, offset: int = 0
) -> list[AuditEventRecord]:
    """Events newest first (the id breaking ties), `action` only where given, one page of them."""
    from sqlmodel import col, select

    from enginecache.db.models import AuditEventRecord

    query = select(AuditEventRecord).order_by(col(AuditEventRecord.at).desc(), col(AuditEventRecord.id).desc())
    if action is not None:
        query = query.where(AuditEventRecord.action == action)
    with app.catalog.read() as session:
        return list(session.exec(query.offset(offset).limit(limit)).all())


def audit_actions(app: AppContext) -> list[str]:
    """Every action recorded so far, sorted (the dashboard's filter)."""
    from sqlmodel import col, select

    from enginecache.db.models import AuditEventRecord

    with app.catalog.read() as session:
        return list(session.exec(select(AuditEventRecord.action).distinct().order_by(col(AuditEventRecord.action))))


def audit_dict(event: AuditEventRecord) -> dict[str, Any]:
    """An event as `enginecache audit --json` prints it (`at` in ISO 8601, UTC)."""
    return {
        "id": event.id,
        "at": event.at.isoformat(),
        "actor": event.actor,
        "origin": event.origin,
        "action": event.action,
        "target": event.target,
        "details": event.details,
    }
