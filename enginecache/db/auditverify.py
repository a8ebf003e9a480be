"""Checking the audit log against its hash chain (`db.auditchain`) and its append-only triggers.

`walk_chain` reads every `audit_events` row in id order, in the caller's transaction (one snapshot:
PostgreSQL at REPEATABLE READ), and stops at the first broken link:

- `edited`: a row's content (or its link) no longer hashes to its `row_hash`;
- `unhashed`: a row without a hash (written past `db.auditchain.append`);
- `deleted`: a row names a predecessor that is not the row before it, whose id is higher than that
  row's: the predecessor (the break's row), and any row between, is gone;
- `inserted`: a row names an earlier predecessor than the row before it: that row was added beside
  the chain;
- `relinked`: a row's predecessor is there but holds another hash than the row recorded for it
  (that row was changed and its own hash computed again);
- `missing`: the log's table or the head's is gone;
- `head`: the head table (`audit_chain_head`) is gone or names another last row or hash than the
  chain ends with (rows cut from the end, or rows added past the head);
- `anchor`: a head kept elsewhere (a backup's manifest) names a row the chain does not hold with
  that hash.

`trigger_problems` says which of migration 0010's append-only triggers is missing, disabled or no
longer refuses what it should, as the database's own catalog describes them (SQLite: `sqlite_master`,
PostgreSQL: `pg_trigger` and `pg_proc`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from enginecache.db.auditchain import GENESIS, HEAD_ID, HEAD_TABLE, row_hash

if TYPE_CHECKING:
    from enginecache.db.sqlexec import Executor

APPEND_ONLY_MESSAGE = "audit_events is append-only"
# SQLite: migration 0010's triggers, exactly as it created them (whitespace runs compared as one).
SQLITE_TRIGGERS = {
    f"audit_events_no_{event.lower()}": (
        f"CREATE TRIGGER audit_events_no_{event.lower()} BEFORE {event} ON audit_events "
        f"BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END"
    )
    for event in ("UPDATE", "DELETE")
}
# PostgreSQL: each trigger's `tgtype` (pg_trigger.h: ROW 1, BEFORE 2, DELETE 8, UPDATE 16, TRUNCATE 32),
# the function they call and its body.
PG_TRIGGERS = {"audit_events_no_change": 1 | 2 | 8 | 16, "audit_events_no_truncate": 2 | 32}
PG_FUNCTION = "audit_events_append_only"
PG_FUNCTION_BODY = f"BEGIN RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}'; END;"
PG_ENABLED = ("O", "A")  # fires in every session but a replica's ("O"), or always ("A")

WALK_BATCH = 1000
_ROWS = (
    "SELECT id, at, actor, origin, action, target, details, prev_id, prev_hash, row_hash FROM audit_events "
    "WHERE id > :after ORDER BY id LIMIT :limit"
)


@dataclass(frozen=True)
class ChainBreak:
    """The first broken link: the row (None: the head), what is wrong (`kind`, see the module
    docstring) and a sentence saying so."""

    row_id: int | None
    kind: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"row_id": self.row_id, "kind": self.kind, "message": self.message}


@dataclass(frozen=True)
class ChainReport:
    """What `walk_chain` found: the rows it checked, the last row's id and hash, the head table's,
    and the first break (None: the chain holds)."""

    rows: int
    last: tuple[int, str] | None
    head: tuple[int | None, str] | None
    broken: ChainBreak | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "last": {"id": self.last[0], "hash": self.last[1]} if self.last else None,
            "head": {"id": self.head[0], "hash": self.head[1]} if self.head else None,
            "broken": self.broken.to_dict() if self.broken else None,
        }


def _rows(ex: Executor, batch: int) -> Iterator[tuple[Any, ...]]:
    after = 0
    while True:
        rows = ex.rows(_ROWS, {"after": after, "limit": batch})
        yield from rows
        if len(rows) < batch:
            return
        after = int(rows[-1][0])


def table_exists(ex: Executor, name: str, *, sqlite: bool) -> bool:
    """Whether the catalog has the table `name` (asked without failing the transaction)."""
    if sqlite:
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = :name"
    else:
        sql = "SELECT 1 WHERE to_regclass(:name) IS NOT NULL"
    return bool(ex.rows(sql, {"name": name}))


def read_head(ex: Executor) -> tuple[int | None, str] | None:
    """The head table's last row id and hash (None: the table has no row)."""
    found = ex.rows(f"SELECT last_id, last_hash FROM {HEAD_TABLE} WHERE id = :id", {"id": HEAD_ID})
    return (found[0][0], str(found[0][1])) if found else None


def _link_break(row_id: int, prev_id: int | None, prev_hash: str, before: tuple[int, str] | None) -> ChainBreak | None:
    """Whether the row `row_id`, which names `prev_id` and `prev_hash` as its predecessor, follows
    `before` (the row before it in id order, None: it is the first)."""
    before_id, before_hash = before if before else (None, GENESIS)
    if prev_id != before_id:
        if prev_id is not None and (before_id is None or prev_id > before_id):
            if before_id is None:
                gone = f"row {prev_id} (and any row before it)"
            elif prev_id - before_id > 1:
                gone = f"row {prev_id} (and any row between row {before_id} and it)"
            else:
                gone = f"row {prev_id}"
            return ChainBreak(prev_id, "deleted", f"{gone} is missing: row {row_id} follows it in the chain")
        named = "the start of the chain" if prev_id is None else f"row {prev_id}"
        return ChainBreak(
            before_id,
            "inserted",
            f"row {before_id} is not in the chain: row {row_id} follows {named}, not row {before_id}",
        )
    if prev_hash != before_hash:
        if before_id is None:
            return ChainBreak(row_id, "relinked", f"row {row_id} is the first row but does not start the chain")
        return ChainBreak(
            before_id,
            "relinked",
            f"row {before_id} was changed and its hash computed again: row {row_id} recorded another hash for it",
        )
    return None


def walk_chain(
    ex: Executor, *, sqlite: bool, anchor: tuple[int, str] | None = None, batch: int = WALK_BATCH
) -> ChainReport:
    """Check every row against its hash and its predecessor, then the head, then `anchor` (a head
    kept elsewhere: its row must be in the chain with that hash); stops at the first break."""
    for table in ("audit_events", HEAD_TABLE):
        if not table_exists(ex, table, sqlite=sqlite):
            return ChainReport(0, None, None, ChainBreak(None, "missing", f"the table {table} is missing"))
    count = 0
    last: tuple[int, str] | None = None
    anchored = anchor is None
    for row in _rows(ex, batch):
        row_id, at, actor, origin, action, target, details, prev_id, prev_hash, stored = row
        row_id = int(row_id)
        count += 1
        if stored is None or prev_hash is None:
            broken = ChainBreak(row_id, "unhashed", f"row {row_id} has no hash: it was written outside the chain")
            return ChainReport(count, last, read_head(ex), broken)
        if row_hash(prev_id, prev_hash, at, actor, origin, action, target, details) != stored:
            broken = ChainBreak(row_id, "edited", f"row {row_id} was changed: its content does not match its hash")
            return ChainReport(count, last, read_head(ex), broken)
        link = _link_break(row_id, None if prev_id is None else int(prev_id), str(prev_hash), last)
        if link is not None:
            return ChainReport(count, last, read_head(ex), link)
        last = (row_id, str(stored))
        if anchor is not None and row_id == anchor[0]:
            anchored = anchor[1] == last[1]
    head = read_head(ex)
    found = _head_break(head, last)
    if found is None and not anchored and anchor is not None:
        found = ChainBreak(
            anchor[0],
            "anchor",
            f"the chain does not hold row {anchor[0]} with the hash the given head names ({anchor[1]}): "
            "the log was rewritten or cut before it",
        )
    return ChainReport(count, last, head, found)


def _head_break(head: tuple[int | None, str] | None, last: tuple[int, str] | None) -> ChainBreak | None:
    if head is None:
        return ChainBreak(None, "head", f"the chain's head ({HEAD_TABLE}) has no row")
    head_id, head_hash = head
    last_id, last_hash = last if last else (None, GENESIS)
    if head_id == last_id and head_hash == last_hash:
        return None
    if last_id is None or (head_id is not None and head_id > last_id):
        ends = "the log is empty" if last_id is None else f"the log ends at row {last_id}"
        return ChainBreak(head_id, "head", f"the head names row {head_id}, and {ends}: rows were cut from its end")
    if head_id is None or head_id < last_id:
        return ChainBreak(last_id, "head", f"row {last_id} lies past the head (row {head_id}): added outside the chain")
    return ChainBreak(last_id, "head", f"the head holds another hash for row {last_id} than the row does")


def _words(sql: str | None) -> str:
    return " ".join((sql or "").split())


def trigger_problems(ex: Executor, *, sqlite: bool) -> list[str]:
    """Each append-only trigger (and, on PostgreSQL, the function they call) that is missing,
    disabled or changed, one sentence each; empty when all stand as migration 0010 made them."""
    return _sqlite_problems(ex) if sqlite else _pg_problems(ex)


def _sqlite_problems(ex: Executor) -> list[str]:
    found = {
        str(name): (str(table), _words(sql))
        for name, table, sql in ex.rows(
            "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'trigger' AND name IN (:a, :b)",
            dict(zip(("a", "b"), SQLITE_TRIGGERS, strict=True)),
        )
    }
    problems = []
    for name, sql in SQLITE_TRIGGERS.items():
        if name not in found:
            problems.append(f"trigger {name} is missing: audit_events rows can be changed or deleted")
        elif found[name] != ("audit_events", _words(sql)):
            problems.append(f"trigger {name} was changed (it may no longer refuse anything): {found[name][1]}")
    return problems


def _pg_problems(ex: Executor) -> list[str]:
    if not table_exists(ex, "audit_events", sqlite=False):
        return ["the audit_events table is missing"]
    rows = ex.rows(
        "SELECT t.tgname, t.tgenabled, t.tgtype, t.tgqual IS NULL AND cardinality(t.tgattr::int2[]) = 0, "
        "p.proname, p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
        "WHERE t.tgrelid = to_regclass('audit_events') AND NOT t.tgisinternal",
        {},
    )
    found = {str(row[0]): row[1:] for row in rows}
    problems = []
    for name, tgtype in PG_TRIGGERS.items():
        if name not in found:
            problems.append(f"trigger {name} is missing: audit_events rows can be changed or deleted")
            continue
        enabled, kind, unconditional, function, body = found[name]
        if str(enabled) not in PG_ENABLED:
            problems.append(f"trigger {name} is disabled (tgenabled {enabled!s}): it refuses nothing")
        if int(kind) != tgtype or not unconditional:
            problems.append(f"trigger {name} was changed: it no longer fires before every change it should")
        if function != PG_FUNCTION or _words(body) != PG_FUNCTION_BODY:
            problems.append(f"trigger {name} calls {function}(), which no longer refuses the change")
    return problems
