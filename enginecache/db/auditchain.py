"""The audit log's hash chain: the one writer of an `audit_events` row, and the one definition of a
row's hash.

Each row names the row before it in the chain (`prev_id`, None for the first) and that row's hash
(`prev_hash`, `GENESIS` for the first), and carries its own hash (`row_hash`): the sha256 of a
canonical JSON of its content (`at`, `actor`, `origin`, `action`, `target`, `details`) with
`prev_id` and `prev_hash` (`row_hash`). The one-row table `audit_chain_head` names the last row
of the chain and its hash. So a row edited, deleted or inserted beside the chain, and rows cut from
its end, break a link that `db.auditverify` finds; a chain rewritten consistently from some row on
(head included) is found only against a head kept elsewhere (a backup's manifest).

`append` inserts a row in the caller's transaction: it locks the head first (an UPDATE of its one
row, which PostgreSQL holds until the transaction ends, so concurrent writers queue there and never
fork the chain; a SQLite write transaction is one writer already), links the row to it and moves
the head on, so the row and the change it records commit together or not at all.

The hash's encoding (`CHAIN_FORMAT`) is fixed for every row ever written: a change to it is a new
format, never an edit of this one. Imports only the stdlib (a cache hit that finds a blob CORRUPT
writes its audit row through `db.engines`).
"""

from __future__ import annotations

import json

from enginecache.db.sqlexec import json_text, sqlite_time
from enginecache.errors import IntegrityCheckError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from enginecache.db.sqlexec import Executor

CHAIN_FORMAT = "enginecache-audit-chain-1"  # the first element of every hashed document
GENESIS = "0" * 64  # the `prev_hash` of the chain's first row, and the head's hash of an empty log
HEAD_TABLE = "audit_chain_head"
HEAD_ID = 1  # the head table's one row

_LOCK_HEAD = f"UPDATE {HEAD_TABLE} SET last_id = last_id WHERE id = {HEAD_ID} RETURNING last_id, last_hash"
_MOVE_HEAD = f"UPDATE {HEAD_TABLE} SET last_id = :id, last_hash = :hash WHERE id = {HEAD_ID}"
_INSERT = (
    "INSERT INTO audit_events (at, actor, origin, action, target, details, prev_id, prev_hash, row_hash) "
    "VALUES (:at, :actor, :origin, :action, :target, :details, :prev_id, :prev_hash, :row_hash) RETURNING id"
)


def at_text(value: Any) -> str:
    """A row's `at` as the chain hashes it: naive UTC text with microseconds, as SQLite stores it
    (a SQLite value is that text already; PostgreSQL's aware datetime is written so)."""
    return value if isinstance(value, str) else sqlite_time(value)


def details_value(value: Any) -> Any:
    """A row's `details` as the chain hashes it: the JSON value (SQLite hands the column's text)."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def row_hash(
    prev_id: int | None,
    prev_hash: str,
    at: Any,
    actor: str,
    origin: str,
    action: str,
    target: str,
    details: Any,
) -> str:
    """The sha256 (hex) of a row's canonical JSON: `CHAIN_FORMAT`, its link and its content, keys
    sorted, no spaces, ASCII. `at` and `details` as stored or read back (`at_text`,
    `details_value`)."""
    import hashlib

    document = [
        CHAIN_FORMAT,
        prev_id,
        prev_hash,
        at_text(at),
        actor,
        origin,
        action,
        target,
        details_value(details),
    ]
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def append(
    ex: Executor,
    *,
    at: Any,
    actor: str,
    origin: str,
    action: str,
    target: str,
    details: Mapping[str, Any],
) -> tuple[int, str]:
    """Append one row to the chain in the caller's transaction and move the head to it; its id and
    hash. `at` as the executor binds a timestamp (`ex.timestamp(...)`). IntegrityCheckError where
    the head row is gone (nothing is written)."""
    head = ex.rows(_LOCK_HEAD, {})
    if not head:
        raise IntegrityCheckError(
            f"the audit chain's head ({HEAD_TABLE}) has no row, so no audit event can be recorded: "
            "run `enginecache audit verify`"
        )
    prev_id, prev_hash = head[0][0], str(head[0][1])
    stored = json_text(dict(details))
    digest = row_hash(prev_id, prev_hash, at, actor, origin, action, target, stored)
    values = {
        "at": at,
        "actor": actor,
        "origin": origin,
        "action": action,
        "target": target,
        "details": stored,
        "prev_id": prev_id,
        "prev_hash": prev_hash,
        "row_hash": digest,
    }
    new_id = int(ex.rows(_INSERT, values)[0][0])
    ex.run(_MOVE_HEAD, {"id": new_id, "hash": digest})
    return new_id, digest
