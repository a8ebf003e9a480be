"""The engine lifecycle: the only code that changes an engine row's `status` (and the facts that change
with it), and the one writer of a load event.

Every function runs its statements through a `db.sqlexec.Executor`, in the transaction the caller
holds (`Catalog.changes()`, a session's `AlchemyExecutor(session.connection())`, or a stdlib
connection's `SqliteWrite`), so a change and its audit row commit together or not at all. The SQL is
the subset SQLite and PostgreSQL share; this module imports only the stdlib (a cache hit calls it).

Transitions (`was` is read in the caller's transaction; the UPDATE is conditional on it, so a
concurrent change on PostgreSQL is read again rather than overwritten):

- `mark_ready`: a build published its blob (PENDING -> READY, with the blob's facts).
- `mark_failed`: a build, or the attempt that ran it, ended without publishing (-> FAILED, with `error`);
  `only_pending` leaves a row that is no longer PENDING as it is.
- `mark_corrupt`: the blob does not match its digest (-> CORRUPT).
- `mark_verified`: the blob matched its digest in full: `verified_at`, `blob_path` and `header_blake3`
  stamped, and a CORRUPT engine READY again.
- `retire`: no lookup returns it again (-> RETIRED, `retired_at`).
- `insert_imported`: an engine built elsewhere, registered by `engine import` (a new row, UNPROVEN,
  with its `provenance`; audited `engine.import`).
- `mark_proven`: a host that can run an UNPROVEN engine loaded it (a test-load's PASS) -> READY, the
  proof added to its `provenance` (audited `engine.proven`). An imported engine reaches READY no other
  way: `mark_verified` puts a CORRUPT one that was never proven back to UNPROVEN.
- `mark_tampered`: its signed statement (`core.signing`) no longer matches its row (-> TAMPERED, audited
  `engine.tampered`); `mark_signature_verified` puts a TAMPERED engine whose row, statement and blob
  agree again back (READY, or UNPROVEN for an unproven import).
- `record_signature`: an admin's `verify --sign` signed it (`signed_statement`, `signature`; the status
  stays; audited `engine.signed`). A build's signature comes with `mark_ready`.
- `note_load_error`: a runtime could not load it on some host (`error`; the status stays).

It also reads engine rows without the ORM (`engine_fields`, decoded as `db.columns` says;
`ready_engine_ids`, the READY set a serving memo is valid for, which both load paths ask) and writes
every load event (`record_load_event`).

One audit rule, the same on every path: a change of status that `AUDITED` names writes one
`audit_events` row (action, `engine <id>`, details `{"by", "was", "reason"?, ...}`, the actor given)
in the same transaction, through the audit chain's one writer (`db.auditchain.append`); a call that
changes nothing writes nothing. A build's own outcome (PENDING ->
READY or FAILED) is not audited here: the build request and the job record it.
"""

from __future__ import annotations

from enginecache.db import auditchain
from enginecache.db.columns import COLUMN_KINDS, DECODERS
from enginecache.db.sqlexec import json_text
from enginecache.errors import EngineCacheError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from datetime import datetime
    from typing import Any, Protocol

    from enginecache.db.sqlexec import Executor

    class Actor(Protocol):
        """Who makes a change (`service.access.audit.Actor`)."""

        @property
        def name(self) -> str: ...

        @property
        def origin(self) -> str: ...


# `db.models.EngineStatus`'s values (tests/test_engine_gateway.py checks they are the same).
PENDING, READY, FAILED, CORRUPT, RETIRED = "PENDING", "READY", "FAILED", "CORRUPT", "RETIRED"
UNPROVEN = "UNPROVEN"
TAMPERED = "TAMPERED"

# Audit actions of status changes (`service.access.audit` re-exports them).
ENGINE_CORRUPT = "engine.corrupt"  # verify, check, a test-load or a serving load found the blob changed
ENGINE_READY = "engine.ready"  # verify found a CORRUPT engine's blob whole again
ENGINE_RETIRE = "engine.retire"
ENGINE_IMPORT = "engine.import"  # an engine built elsewhere registered (UNPROVEN)
ENGINE_PROVEN = "engine.proven"  # a host that can run an imported engine loaded it: UNPROVEN -> READY
ENGINE_UNPROVEN = "engine.unproven"  # verify found a CORRUPT, never proven import's blob whole again
ENGINE_TAMPERED = "engine.tampered"  # a load, pull, verify or check found its row changed from what was signed
ENGINE_SIGNED = "engine.signed"  # an admin's `verify --sign` signed it
ENGINE_REMOTE_BAD = "engine.remote_bad"  # `verify --remote` found the remote store's copy not the blob
ENGINE_REMOTE_OK = "engine.remote_ok"  # `verify --remote` found a copy it had found bad whole again


def audited_action(was: str, status: str) -> str | None:
    """The audit action of a change of status from `was` to `status` (None: not audited)."""
    if status == CORRUPT:
        return ENGINE_CORRUPT
    if status == TAMPERED:
        return ENGINE_TAMPERED
    if status == RETIRED:
        return ENGINE_RETIRE
    if status == READY and was in (CORRUPT, TAMPERED):
        return ENGINE_READY
    if status == READY and was == UNPROVEN:
        return ENGINE_PROVEN
    if status == UNPROVEN and was in (CORRUPT, TAMPERED):
        return ENGINE_UNPROVEN
    return None


# How each engine column is stored (`db.columns`' kinds); `retired_at` is written only here and is
# not among the reader's listed columns.
_KINDS = {**COLUMN_KINDS["engines"], "retired_at": "time"}
# The columns a transition may set beside `status`, each with its kind.
_SETTABLE = (
    "error builder_log variant_model_id sha256 blake3 header_blake3 chunk_blake3 size_bytes blob_path build_seconds io"
    " warnings finished_at verified_at retired_at provenance signed_statement signature"
)
FIELD_KINDS = {name: _KINDS[name] for name in _SETTABLE.split()}
LOAD_PHASES = ("validity", "deserialize", "create_context", "allocate_io")  # a load event's `load_s`
CHANGE_TRIES = 8  # reads of `was` before a status that keeps changing under us is an error


def _status(ex: Executor, engine_id: int) -> str | None:
    found = ex.rows("SELECT status FROM engines WHERE id = :id", {"id": engine_id})
    return str(found[0][0]) if found else None


def _bind(ex: Executor, fields: Mapping[str, Any]) -> dict[str, Any]:
    bound: dict[str, Any] = {}
    for name, value in fields.items():
        kind = FIELD_KINDS[name]  # a KeyError: a column no transition sets
        if value is None or not kind:
            bound[name] = value
        else:
            bound[name] = json_text(value) if kind == "json" else ex.timestamp(value)
    return bound


def _change(
    ex: Executor,
    engine_id: int,
    status: Callable[[str], str | None],
    fields: Mapping[str, Any],
    *,
    actor: Actor | None,
    by: str,
    reason: str = "",
    details: Mapping[str, Any] | None = None,
) -> str | None:
    """Set the engine's status to `status(was)` (None: leave the row as it is) with `fields`, and
    audit the change where `audited_action` says so; the status it had (None: no such engine)."""
    for _ in range(CHANGE_TRIES):
        was = _status(ex, engine_id)
        if was is None:
            return None
        new = status(was)
        if new is None or (new == was and not fields):
            return was
        sets = ", ".join(f"{name} = :{name}" for name in ("status", *fields))
        values = {**_bind(ex, fields), "status": new, "id": engine_id, "was": was}
        if ex.run(f"UPDATE engines SET {sets} WHERE id = :id AND status = :was", values):
            action = audited_action(was, new) if new != was else None
            if action is not None:
                if actor is None:
                    raise ValueError(f"engine {engine_id}: {was} -> {new} is audited, and no actor was given")
                event = {"by": by, "was": was, **({"reason": reason} if reason else {}), **(details or {})}
                _audit(ex, actor, action, f"engine {engine_id}", event)
            return was
    raise EngineCacheError(f"engine {engine_id}'s status changed {CHANGE_TRIES} times while it was being set")


def _audit(ex: Executor, actor: Actor, action: str, target: str, details: Mapping[str, Any]) -> None:
    auditchain.append(
        ex, at=ex.timestamp(), actor=actor.name, origin=actor.origin, action=action, target=target, details=details
    )


def _to(status: str) -> Callable[[str], str]:
    return lambda _was: status


# -- the transitions ----------------------------------------------------------------------------


def mark_ready(ex: Executor, engine_id: int, facts: Mapping[str, Any]) -> str | None:
    """A build published the blob: READY with `facts` (sha256, blake3, size, blob_path, io, ...)."""
    return _change(ex, engine_id, _to(READY), facts, actor=None, by="build")


def mark_failed(
    ex: Executor, engine_id: int, error: str, *, at: datetime, only_pending: bool = False, builder_log: str = ""
) -> str | None:
    """FAILED with `error` (and `builder_log` where given), finished `at`; `only_pending`: only a row
    still PENDING (a build that finished meanwhile keeps its status). The status it had."""

    def failed(was: str) -> str | None:
        return FAILED if was == PENDING or not only_pending else None

    fields: dict[str, Any] = {"error": error, "finished_at": at}
    if builder_log:
        fields["builder_log"] = builder_log
    return _change(ex, engine_id, failed, fields, actor=None, by="build")


def mark_corrupt(
    ex: Executor,
    engine_id: int,
    *,
    actor: Actor,
    by: str,
    reason: str,
    details: Mapping[str, Any] | None = None,
) -> str | None:
    """CORRUPT (audited once: an engine CORRUPT already is left as it is). The status it had."""
    return _change(ex, engine_id, _to(CORRUPT), {}, actor=actor, by=by, reason=reason, details=details)


def mark_verified(
    ex: Executor,
    engine_id: int,
    *,
    at: datetime,
    blob_path: str,
    header_blake3: str | None,
    chunk_blake3: str | None,
    actor: Actor,
    by: str,
    reason: str,
) -> str | None:
    """Its blob matched its digest in full at `at`: `verified_at`, `blob_path`, `header_blake3` and
    `chunk_blake3` set, and a CORRUPT engine READY again, or UNPROVEN where it is an import no host
    has proven (audited). The status it had."""
    whole_again = UNPROVEN if _unproven_import(ex, engine_id) else READY

    def verified(was: str) -> str:
        return whole_again if was == CORRUPT else was

    fields = {"verified_at": at, "blob_path": blob_path, "header_blake3": header_blake3, "chunk_blake3": chunk_blake3}
    return _change(ex, engine_id, verified, fields, actor=actor, by=by, reason=reason)


def retire(
    ex: Executor, engine_id: int, *, at: datetime, actor: Actor, by: str, details: Mapping[str, Any] | None = None
) -> str | None:
    """RETIRED at `at` (audited once: a RETIRED engine is left as it is). The status it had."""

    def retired(was: str) -> str | None:
        return None if was == RETIRED else RETIRED

    return _change(ex, engine_id, retired, {"retired_at": at}, actor=actor, by=by, details=details)


def _provenance(ex: Executor, engine_id: int) -> dict[str, Any]:
    found = engine_fields(ex, engine_id, ("provenance",))
    return dict((found or {}).get("provenance") or {})


def _unproven_import(ex: Executor, engine_id: int) -> bool:
    provenance = _provenance(ex, engine_id)
    return provenance.get("kind") == "imported" and not provenance.get("proven")


def insert_imported(ex: Executor, row: Mapping[str, Any], *, actor: Actor, details: Mapping[str, Any]) -> int:
    """Add an engine built elsewhere: `row` holds its columns (`IMPORT_COLUMNS`; `provenance` with
    `kind` "imported"), its status is UNPROVEN, and its `engine.import` audit row (`details`) is
    written in the same transaction. Its id."""
    if (row.get("provenance") or {}).get("kind") != "imported":
        raise ValueError("an imported engine's provenance says kind 'imported'")
    values: dict[str, Any] = {}
    for name in IMPORT_COLUMNS:
        value, kind = row.get(name), _KINDS.get(name, "")
        if value is not None and kind == "json":
            value = json_text(value)
        elif kind == "time":
            value = ex.timestamp(value)
        values[name] = value
    values["status"] = UNPROVEN
    names = (*IMPORT_COLUMNS, "status")
    found = ex.rows(
        f"INSERT INTO engines ({', '.join(names)}) VALUES ({', '.join(':' + n for n in names)}) RETURNING id", values
    )
    engine_id = int(found[0][0])
    _audit(ex, actor, ENGINE_IMPORT, f"engine {engine_id}", {"by": "import", **details})
    return engine_id


# The columns `insert_imported` writes (`status` is UNPROVEN; the rest of the row keeps its defaults).
_IMPORTED = (
    "model_id backend backend_version precision targets cache_key onnx_digest key_ingredients precision_recipe"
    " build_options target_info os host io warnings sha256 blake3 header_blake3 chunk_blake3 size_bytes"
    " blob_path builder_log created_at finished_at verified_at provenance"
)
IMPORT_COLUMNS = tuple(_IMPORTED.split())


def mark_proven(
    ex: Executor,
    engine_id: int,
    *,
    at: datetime,
    host: str,
    actor: Actor,
    by: str,
    details: Mapping[str, Any] | None = None,
) -> str | None:
    """A host that can run the UNPROVEN engine loaded it at `at`: READY, with `provenance.proven`
    (`at`, `host`, `by`, `details`), audited `engine.proven`. Any other status is left as it is. The
    status it had."""
    proof = {"at": at.isoformat(), "host": host, "by": by, **(details or {})}
    provenance = {**_provenance(ex, engine_id), "proven": proof}

    def proven(was: str) -> str | None:
        return READY if was == UNPROVEN else None

    return _change(
        ex, engine_id, proven, {"provenance": provenance}, actor=actor, by=by, details={"host": host, **(details or {})}
    )


def mark_tampered(
    ex: Executor,
    engine_id: int,
    *,
    actor: Actor,
    by: str,
    reason: str,
    details: Mapping[str, Any] | None = None,
) -> str | None:
    """TAMPERED: its signed statement no longer matches its row (audited once; a PENDING, FAILED,
    RETIRED or TAMPERED engine is left as it is). The status it had."""

    def tampered(was: str) -> str | None:
        return TAMPERED if was in (READY, UNPROVEN, CORRUPT) else None

    return _change(ex, engine_id, tampered, {}, actor=actor, by=by, reason=reason, details=details)


def mark_signature_verified(ex: Executor, engine_id: int, *, actor: Actor, by: str, reason: str) -> str | None:
    """A TAMPERED engine whose row, signed statement and blob agree again (an admin restored the row):
    READY, or UNPROVEN where it is an import no host has proven (audited). Any other status is left
    as it is. The status it had."""
    whole_again = UNPROVEN if _unproven_import(ex, engine_id) else READY

    def restored(was: str) -> str | None:
        return whole_again if was == TAMPERED else None

    return _change(ex, engine_id, restored, {}, actor=actor, by=by, reason=reason)


def record_signature(
    ex: Executor,
    engine_id: int,
    *,
    statement: str,
    signature: str,
    actor: Actor,
    by: str,
    details: Mapping[str, Any] | None = None,
) -> str | None:
    """Store an engine's signed statement and signature (its status stays), audited `engine.signed`.
    The status it had (None: no such engine)."""
    was = _change(
        ex, engine_id, lambda was: was, {"signed_statement": statement, "signature": signature}, actor=actor, by=by
    )
    if was is not None:
        _audit(ex, actor, ENGINE_SIGNED, f"engine {engine_id}", {"by": by, "status": was, **(details or {})})
    return was


def record_remote_check(
    ex: Executor, engine_id: int, *, at: datetime, problem: str | None, actor: Actor, by: str
) -> bool:
    """The remote store's copy was re-hashed at `at`: `remote_verified_at` and `remote_problem` set
    (None: the object is the blob); its status stays (it is the local blob's). A copy found bad is
    audited `engine.remote_bad`, one found whole after being found bad `engine.remote_ok`. Whether
    there is such an engine."""
    found = engine_fields(ex, engine_id, ("remote_problem",))
    if found is None:
        return False
    ex.run(
        "UPDATE engines SET remote_verified_at = :at, remote_problem = :problem WHERE id = :id",
        {"at": ex.timestamp(at), "problem": problem, "id": engine_id},
    )
    target = f"engine {engine_id}"
    if problem is not None:
        _audit(ex, actor, ENGINE_REMOTE_BAD, target, {"by": by, "reason": problem})
    elif found["remote_problem"] is not None:
        _audit(ex, actor, ENGINE_REMOTE_OK, target, {"by": by, "was": found["remote_problem"]})
    return True


def note_load_error(ex: Executor, engine_id: int, note: str) -> None:
    """A runtime could not load the engine on some host: `error` says so; its status stays."""
    ex.run("UPDATE engines SET error = :error WHERE id = :id", {"error": note, "id": engine_id})


# -- reads --------------------------------------------------------------------------------------


def engine_fields(ex: Executor, engine_id: int, columns: Sequence[str]) -> dict[str, Any] | None:
    """The engine row's `columns`, each decoded by its kind (`db.columns`, and `_KINDS` for the
    column only this module writes); None where there is no such engine."""
    if not all(name.isidentifier() for name in columns):
        raise ValueError(f"not column names: {columns}")
    found = ex.rows(f"SELECT {', '.join(columns)} FROM engines WHERE id = :id", {"id": engine_id})
    if not found:
        return None
    return {
        name: DECODERS[_KINDS[name]](value) if _KINDS.get(name) else value
        for name, value in zip(columns, found[0], strict=True)
    }


def ready_engine_ids(ex: Executor, model_id: int) -> list[int]:
    """The model's READY engines' ids, ascending: the set a serving memo is valid for."""
    rows = ex.rows(
        "SELECT id FROM engines WHERE model_id = :model_id AND status = :ready ORDER BY id",
        {
            "model_id": model_id,
            "ready": READY,
        },
    )
    return [int(row[0]) for row in rows]


# -- load events --------------------------------------------------------------------------------

LOAD_EVENT_COLUMNS = (
    "hostname",
    "model_name",
    "model_id",
    "engine_id",
    "backend",
    "precision",
    "host_target",
    "outcome",
    "source",
    "reason",
    "lookup_s",
    "read_verify_s",
    "load_s",
    "build_s",
    "total_s",
    "stat_cache_hit",
    "phases",
    "created_at",
)
_INSERT_LOAD_EVENT = (
    f"INSERT INTO load_events ({', '.join(LOAD_EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(':' + name for name in LOAD_EVENT_COLUMNS)})"
)


def phase_seconds(phases: Mapping[str, float]) -> dict[str, float | None]:
    """A load event's seconds per step, from its phases: lookup, read_verify, load (`LOAD_PHASES`), build."""
    return {
        "lookup_s": phases.get("lookup"),
        "read_verify_s": phases.get("read_verify"),
        "load_s": sum(phases.get(p, 0.0) for p in LOAD_PHASES),
        "build_s": phases.get("build"),
    }


def record_load_event(ex: Executor, event: Mapping[str, Any]) -> None:
    """Append one load event (`db.models.LoadEventRecord`'s columns; `source` "load_or_build", `reason`
    "", `total_s` 0 and `phases` {} where not given; `created_at` now where not given)."""
    row = {name: event.get(name) for name in LOAD_EVENT_COLUMNS}
    row["source"] = row["source"] or "load_or_build"
    row["reason"] = row["reason"] or ""
    row["total_s"] = row["total_s"] or 0.0
    row["phases"] = json_text(dict(row["phases"] or {}))
    row["created_at"] = ex.timestamp(row["created_at"])
    ex.run(_INSERT_LOAD_EVENT, row)
