"""The engine-lifecycle gateway (`db.engines`): the only writer of `engines.status`, each change and its
audit row in one transaction, the same SQL on a stdlib sqlite3 connection and on SQLAlchemy (SQLite
and PostgreSQL)."""

from __future__ import annotations

import ast
import re
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from sqlmodel import col, select

from enginecache.db import engines
from enginecache.db.models import AuditEventRecord, EngineRecord, EngineStatus, LoadEventRecord, ModelRecord
from enginecache.db.sqlexec import SqliteWrite
from enginecache.service.access.audit import Actor
from enginecache.service.context import AppContext

if TYPE_CHECKING:
    from enginecache.db.sqlexec import Executor

PACKAGE = Path(__file__).resolve().parents[1] / "enginecache"
GATEWAY = PACKAGE / "db" / "engines.py"
MIGRATIONS = PACKAGE / "db" / "migrations"
ALICE = Actor("alice", "dashboard 10.0.0.7")
AT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)

# -- nothing else writes engines.status ----------------------------------------------------------

_RAW_UPDATE = re.compile(r"\bUPDATE\s+engines\b", re.IGNORECASE)
_ENGINE_NAMES = ("EngineRecord", "EngineStatus")


def status_writes(source: str) -> list[str]:
    """Where `source` (one module) writes an engine's status outside the gateway: an assignment to
    `.status` (or `setattr(_, "status", _)`) in a function that handles engine rows, a `status=`
    keyword given to `update()`/`values()` there (or to `EngineRecord(...)` where the function adds
    rows to a session), or SQL text that updates the engines table. Each as `line N: text`."""
    tree = ast.parse(source)
    found: list[str] = []

    def note(node: ast.AST) -> None:
        found.append(f"line {getattr(node, 'lineno', 0)}: {ast.get_source_segment(source, node)}")

    scopes: list[ast.AST] = [
        tree,
        *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)),
    ]
    for scope in scopes:
        body = ast.get_source_segment(source, scope) if scope is not tree else source
        if body is None or not any(name in body for name in _ENGINE_NAMES):
            continue
        for node in _own_nodes(scope):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for target in node.targets for t in _flat(target)]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            if any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets):
                note(node)
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name == "setattr" and len(node.args) > 1 and _is_text(node.args[1], "status"):
                    note(node)
                writes = ("update", "values", "EngineRecord") if _adds_rows(scope) else ("update", "values")
                if name in writes and any(k.arg == "status" for k in node.keywords):
                    note(node)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _RAW_UPDATE.search(node.value):
            note(node)
    return sorted(set(found))


def _own_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of `scope` outside the functions nested in it (each is a scope of its own)."""
    for child in ast.iter_child_nodes(scope):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        yield child
        yield from _own_nodes(child)


def _adds_rows(scope: ast.AST) -> bool:
    """Whether `scope` adds rows to a session (`.add(...)`, `.add_all(...)`): an `EngineRecord(...)`
    built there is an insert, not a value that only reads like a row."""
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("add", "add_all")
        for n in _own_nodes(scope)
    )


def _flat(target: ast.expr) -> list[ast.expr]:
    return [t for e in target.elts for t in _flat(e)] if isinstance(target, ast.Tuple | ast.List) else [target]


def _is_text(node: ast.expr, text: str) -> bool:
    return isinstance(node, ast.Constant) and node.value == text


def test_only_the_gateway_writes_engine_status() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == GATEWAY or MIGRATIONS in path.parents:
            continue
        writes = status_writes(path.read_text())
        if writes:
            offenders[str(path.relative_to(PACKAGE))] = writes
    assert offenders == {}, "engines.status is written outside db/engines.py"


@pytest.mark.parametrize(
    "snippet",
    [
        "def f(s):\n    row = s.get(EngineRecord, 1)\n    row.status = EngineStatus.CORRUPT\n",
        "def f(s, r):\n    r.status, r.retired_at = EngineStatus.RETIRED, now()\n    s.add(EngineRecord)\n",
        "def f(s):\n    s.execute(sa.update(EngineRecord).values(status='FAILED'))\n",
        "def f(s):\n    s.add(EngineRecord(model_id=1, status=EngineStatus.READY))\n",
        "def f(s, row):\n    setattr(row, 'status', 'READY')\n    return EngineRecord\n",
        "SQL = \"UPDATE engines SET status = 'CORRUPT' WHERE id = ?\"\n",
        "def f(c):\n    c.execute('update  engines set error = ? where id = ?')\n",
    ],
)
def test_the_scan_finds_each_way_of_writing_an_engine_status(snippet: str) -> None:
    assert status_writes(snippet), snippet


@pytest.mark.parametrize(
    "snippet",
    [
        "def f(s):\n    job = s.get(JobRecord, 1)\n    job.status = JobStatus.RUNNING\n",
        "def f(s):\n    row = s.get(ModelRecord, 1)\n    row.status = ModelStatus.CORRUPT\n",
        "def f(e):\n    return {'status': EngineStatus.RETIRED.value, 'id': e}\n",
        "def f(s):\n    return s.exec(select(EngineRecord).where(EngineRecord.status == 'READY'))\n",
        "def f(g):\n    return EngineRecord(id=g.id, status=g.status)\n",
    ],
)
def test_the_scan_leaves_other_statuses_and_reads_alone(snippet: str) -> None:
    assert status_writes(snippet) == [], snippet


def test_the_gateway_names_the_models_statuses() -> None:
    names = (
        *(engines.PENDING, engines.READY, engines.FAILED, engines.CORRUPT, engines.RETIRED, engines.UNPROVEN),
        engines.TAMPERED,
    )
    assert sorted(names) == sorted(status.value for status in EngineStatus)
    assert set(engines.FIELD_KINDS) <= set(EngineRecord.__table__.columns.keys())  # type: ignore[attr-defined]
    assert set(engines.LOAD_EVENT_COLUMNS) == set(LoadEventRecord.__table__.columns.keys()) - {"id"}  # type: ignore[attr-defined]


# -- the transitions, on each database and each kind of connection --------------------------------

Changes = Callable[[], AbstractContextManager["Executor"]]


def _engine(app: AppContext, status: str = EngineStatus.READY) -> int:
    with app.catalog.write() as session:
        model = session.exec(select(ModelRecord)).first()
        if model is None:
            model = ModelRecord(name="m", digest="d" * 64, filename="m.onnx", store_path="models/d", size_bytes=1)
            session.add(model)
            session.flush()
        engine = EngineRecord(
            model_id=model.id or 0,
            backend="ort",
            backend_version="1",
            precision="fp32",
            targets="x86_64",
            cache_key="k" * 64,
            status=status,
            onnx_digest=model.digest,
            os="linux",
        )
        session.add(engine)
    return engine.id or 0


def _row(app: AppContext, engine_id: int) -> EngineRecord:
    with app.catalog.read() as session:
        row = session.get(EngineRecord, engine_id)
    assert row is not None
    return row


def _audit(app: AppContext) -> list[AuditEventRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(AuditEventRecord).order_by(col(AuditEventRecord.id))).all())


@pytest.fixture(params=["sqlalchemy", "stdlib"])
def changes(request: pytest.FixtureRequest, catalog_ctx: AppContext) -> Iterator[Changes]:
    """A write transaction's executor on `catalog_ctx`: SQLAlchemy's, or (SQLite only) a stdlib
    sqlite3 connection's, as a cache hit opens it."""
    if request.param == "sqlalchemy":
        yield catalog_ctx.catalog.changes
        return
    if not catalog_ctx.catalog.is_sqlite:
        pytest.skip("a stdlib connection opens SQLite catalogs only")
    connection = sqlite3.connect(catalog_ctx.home / "catalog.db", isolation_level=None)
    try:
        yield lambda: SqliteWrite(connection)
    finally:
        connection.close()


def test_a_corrupt_mark_and_its_audit_row_are_one_change(catalog_ctx: AppContext, changes: Changes) -> None:
    app = catalog_ctx
    engine_id = _engine(app)
    for _ in range(2):  # the second finds it CORRUPT already: nothing changes, nothing is recorded
        with changes() as ex:
            engines.mark_corrupt(ex, engine_id, actor=ALICE, by="verify", reason="sha256 differs", details={"n": 1})
    assert _row(app, engine_id).status == EngineStatus.CORRUPT
    (event,) = _audit(app)
    assert (event.action, event.target, event.actor, event.origin) == (
        engines.ENGINE_CORRUPT,
        f"engine {engine_id}",
        ALICE.name,
        ALICE.origin,
    )
    assert event.details == {"by": "verify", "was": "READY", "reason": "sha256 differs", "n": 1}
    assert abs(event.at - datetime.now(UTC)) < timedelta(minutes=1)


def test_a_change_that_does_not_commit_leaves_no_audit_row(catalog_ctx: AppContext, changes: Changes) -> None:
    engine_id = _engine(catalog_ctx)
    with pytest.raises(RuntimeError), changes() as ex:
        engines.mark_corrupt(ex, engine_id, actor=ALICE, by="check", reason="r")
        raise RuntimeError("the caller's transaction fails after the mark")
    assert _row(catalog_ctx, engine_id).status == EngineStatus.READY
    assert _audit(catalog_ctx) == []


def test_verify_retire_and_a_build_s_outcomes(catalog_ctx: AppContext, changes: Changes) -> None:
    app = catalog_ctx
    corrupt, pending, ready = _engine(app, EngineStatus.CORRUPT), _engine(app, EngineStatus.PENDING), _engine(app)
    with changes() as ex:
        was = engines.mark_verified(
            ex,
            corrupt,
            at=AT,
            blob_path="blobs/x",
            header_blake3="h",
            chunk_blake3=None,
            actor=ALICE,
            by="verify",
            reason="ok",
        )
        assert was == EngineStatus.CORRUPT
        assert engines.mark_failed(ex, ready, "abandoned", at=AT, only_pending=True) == EngineStatus.READY
        facts = {"sha256": "s" * 64, "size_bytes": 5, "io": [{"name": "input"}], "warnings": ["w"], "finished_at": AT}
        assert engines.mark_ready(ex, pending, facts) == EngineStatus.PENDING
        engines.note_load_error(ex, ready, "host-a could not load it")
        assert engines.retire(ex, ready, at=AT, actor=ALICE, by="retire", details={"model_id": 1}) == "READY"
        assert engines.retire(ex, ready, at=AT, actor=ALICE, by="retire") == EngineStatus.RETIRED
        assert engines.mark_corrupt(ex, 10_000, actor=ALICE, by="check", reason="r") is None  # no such engine
    verified = _row(app, corrupt)
    assert (verified.status, verified.verified_at, verified.blob_path, verified.header_blake3) == (
        "READY",
        AT,
        "blobs/x",
        "h",
    )
    built = _row(app, pending)
    assert (built.status, built.sha256, built.size_bytes, built.finished_at) == ("READY", "s" * 64, 5, AT)
    assert (built.io, built.warnings) == ([{"name": "input"}], ["w"])
    retired = _row(app, ready)
    assert (retired.status, retired.retired_at, retired.error) == ("RETIRED", AT, "host-a could not load it")
    with changes() as ex:
        assert engines.ready_engine_ids(ex, retired.model_id) == sorted([corrupt, pending])
        assert engines.engine_fields(ex, pending, ["status", "io", "finished_at", "retired_at", "build_options"]) == {
            "status": "READY",
            "io": [{"name": "input"}],
            "finished_at": AT,
            "retired_at": None,
            "build_options": {},
        }
        assert engines.engine_fields(ex, ready, ["retired_at"]) == {"retired_at": AT}
        assert engines.engine_fields(ex, 10_000, ["status"]) is None
    assert [(e.action, e.target, e.details) for e in _audit(app)] == [
        (engines.ENGINE_READY, f"engine {corrupt}", {"by": "verify", "was": "CORRUPT", "reason": "ok"}),
        (engines.ENGINE_RETIRE, f"engine {ready}", {"by": "retire", "was": "READY", "model_id": 1}),
    ]


def test_a_failed_build_only_where_still_pending(catalog_ctx: AppContext, changes: Changes) -> None:
    pending = _engine(catalog_ctx, EngineStatus.PENDING)
    with changes() as ex:
        assert engines.mark_failed(ex, pending, "attempt 1 ended", at=AT, only_pending=True) == "PENDING"
        assert engines.mark_failed(ex, pending, "again", at=AT, only_pending=True) == "FAILED"
    row = _row(catalog_ctx, pending)
    assert (row.status, row.error, row.finished_at) == ("FAILED", "attempt 1 ended", AT)
    assert _audit(catalog_ctx) == [], "a build's own outcome is the job's record, not an audit row"


def test_a_load_event_reads_back_as_the_orm_writes_it(catalog_ctx: AppContext, changes: Changes) -> None:
    engine_id = _engine(catalog_ctx)
    phases = {"lookup": 0.5, "read_verify": 0.25, "validity": 0.125, "deserialize": 1.0}
    event = {
        "hostname": "h",
        "model_name": "m",
        "engine_id": engine_id,
        "backend": "ort",
        "precision": "fp32",
        "host_target": "x86_64",
        "outcome": "hit",
        "stat_cache_hit": True,
        "total_s": 2.0,
        "phases": phases,
        **engines.phase_seconds(phases),
    }
    with changes() as ex:
        engines.record_load_event(ex, event)
    with catalog_ctx.catalog.read() as session:
        (row,) = session.exec(select(LoadEventRecord)).all()
    assert (row.outcome, row.source, row.reason, row.stat_cache_hit, row.phases) == (
        "hit",
        "load_or_build",
        "",
        True,
        phases,
    )
    assert (row.lookup_s, row.read_verify_s, row.load_s, row.build_s) == (0.5, 0.25, 1.125, None)
    assert abs(row.created_at - datetime.now(UTC)) < timedelta(minutes=1)
