"""The audit log (`service.audit`, table `audit_events`): every change recorded once, right after it
succeeded, with its actor, origin and target; rows the database refuses to change or delete (SQLite
and PostgreSQL); the migration up and down; `enginecache audit --json`; the dashboard's Audit view and
the Streamlit user each run acts as."""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import typer
from alembic import command
from alembic.config import Config
from streamlit.testing.v1 import AppTest
from typer.testing import CliRunner

from enginecache.cli import auditcmd
from enginecache.cli.app import COMMANDS, LazyGroup
from enginecache.cli.common import CliSettings
from enginecache.core.blobpaths import blob_path
from enginecache.core.plaintext import markdown_literal
from enginecache.dashboard import app as dashboard_app
from enginecache.db.catalog import MIGRATIONS_DIR
from enginecache.db.models import AuditEventRecord, EngineStatus, JobStatus, ModelStatus, UserRoleRecord
from enginecache.db.reader import sqlite_url
from enginecache.service import audit
from enginecache.service.audit import Actor, acting_as, current_actor, list_audit, local_actor, record
from enginecache.service.builds import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines import check_engine, get_engine, retire_engine, verify_engines
from enginecache.service.jobs import cancel_job, submit_build
from enginecache.service.models import get_model, register_model
from enginecache.service.modelverify import bundle_path, verify_models
from enginecache.service.testload import run_test_load, submit_test_load
from tests.clirunner import run_cli
from tests.conftest import corrupt_blob
from tests.dashboardkit import TIMEOUT, frame, serve_home, view

ALICE = Actor("alice@example.com", "dashboard 10.0.0.7")  # a logged-in user (not local): her role is a row


def _grant(app: AppContext, subject: str, role: str = "admin") -> None:
    """A role row written directly (no `role.set` event among the events a test counts)."""
    with app.catalog.write() as session:
        session.add(UserRoleRecord(subject=subject.lower(), role=role, granted_by="test"))


def _events(app: AppContext) -> list[tuple[str, str]]:
    """(action, target) of every event, oldest first."""
    return [(e.action, e.target) for e in reversed(list_audit(app, limit=None))]


# -- what is recorded -------------------------------------------------------------------------


def test_every_change_is_recorded_once_with_its_actor_origin_and_target(catalog_ctx: AppContext, mlp: Path) -> None:
    app = catalog_ctx
    request = BuildRequest(model="mlp", backend="ort")
    _grant(app, ALICE.name)
    with acting_as(ALICE):
        model = register_model(app, mlp, name="mlp").model
        register_model(app, mlp)  # the same bytes, nothing changed: not recorded
        submitted = submit_build(app, request)
        assert submitted.job is not None and not submitted.joined
        assert submit_build(app, request).joined  # joined the active job: not recorded
        cancel_job(app, submitted.job.id or 0)
        assert cancel_job(app, submitted.job.id or 0).status == JobStatus.CANCELLED  # already: not recorded
        engine = build_engine(app, request).engine
        assert submit_build(app, request).cache_hit  # a cache hit: not recorded
        test_load = submit_test_load(app, engine.id or 0, iterations=1)
        assert submit_test_load(app, engine.id or 0, iterations=1).id == test_load.id  # joined: not recorded

        blob = blob_path(app.home, engine.sha256)
        at = corrupt_blob(blob)
        verify_engines(app, [engine.id or 0])
        verify_engines(app, [engine.id or 0])  # still CORRUPT: no second record
        corrupt_blob(blob, at)  # the same bits flipped back: whole again
        verify_engines(app, [engine.id or 0])
        corrupt_blob(blob, at)
        assert check_engine(app, engine.id or 0).verdict == "corrupt"
        corrupt_blob(blob, at)
        verify_engines(app, [engine.id or 0])
        corrupt_blob(blob, at)
        assert run_test_load(app, engine.id or 0, iterations=1).verdict == "CORRUPT"
        corrupt_blob(blob, at)
        verify_engines(app, [engine.id or 0])
        retire_engine(app, engine.id or 0)
        retire_engine(app, engine.id or 0)  # already RETIRED: not recorded

        corrupt_blob(bundle_path(app, model))
        verify_models(app)
        verify_models(app)  # still CORRUPT: no second record
        assert register_model(app, mlp).repaired
        assert get_model(app, model.id or 0).status == ModelStatus.OK
    assert get_engine(app, engine.id or 0).status == EngineStatus.RETIRED

    m, e, j = f"model {model.id}", f"engine {engine.id}", f"job {submitted.job.id}"
    assert _events(app) == [
        (audit.MODEL_REGISTER, m),
        (audit.BUILD_SUBMIT, m),
        (audit.JOB_CANCEL, j),
        (audit.BUILD_RUN, e),  # build_engine built it in this process
        (audit.TEST_LOAD_SUBMIT, e),
        (audit.ENGINE_CORRUPT, e),
        (audit.ENGINE_READY, e),
        (audit.ENGINE_CORRUPT, e),
        (audit.ENGINE_READY, e),
        (audit.ENGINE_CORRUPT, e),
        (audit.ENGINE_READY, e),
        (audit.ENGINE_RETIRE, e),
        (audit.MODEL_CORRUPT, m),
        (audit.MODEL_REPAIR, m),
    ]
    events = list_audit(app, limit=None)
    assert {(ev.actor, ev.origin) for ev in events} == {(ALICE.name, ALICE.origin)}
    assert all(ev.at.tzinfo is not None for ev in events)
    by_action = {ev.action: ev.details for ev in reversed(events)}  # the newest of each action
    registered = by_action[audit.MODEL_REGISTER]
    assert registered["name"] == "mlp" and registered["digest"] == model.digest and registered["new_version"] is False
    assert by_action[audit.BUILD_SUBMIT]["job_id"] == submitted.job.id
    assert by_action[audit.BUILD_SUBMIT]["backend"] == "ort" and by_action[audit.BUILD_SUBMIT]["precision"] == "fp32"
    assert by_action[audit.JOB_CANCEL] == {"kind": "build", "was": "QUEUED", "status": "CANCELLED"}
    assert by_action[audit.TEST_LOAD_SUBMIT]["job_id"] == test_load.id
    corrupt_by = [ev.details["by"] for ev in reversed(events) if ev.action == audit.ENGINE_CORRUPT]
    assert corrupt_by == ["verify", "check", "test-load"]
    assert by_action[audit.ENGINE_RETIRE]["was"] == "READY"
    assert model.digest in by_action[audit.MODEL_CORRUPT]["reason"]

    assert [ev.action for ev in list_audit(app, action=audit.ENGINE_READY)] == [audit.ENGINE_READY] * 3
    newest_two = list_audit(app, limit=2)
    assert [ev.action for ev in newest_two] == [audit.MODEL_REPAIR, audit.MODEL_CORRUPT]
    assert [ev.id for ev in list_audit(app, limit=2, offset=1)] == [ev.id for ev in events[1:3]]
    assert audit.audit_actions(app) == sorted({a for a, _ in _events(app)})


def test_the_default_actor_is_the_local_os_user(catalog_ctx: AppContext) -> None:
    event = record(catalog_ctx, "test.default", "nothing")
    assert (event.actor, event.origin) == (getpass.getuser(), f"cli {socket.gethostname()} pid {os.getpid()}")
    assert current_actor() == local_actor()


def test_acting_as_changes_the_recorded_actor_for_its_block_and_thread(app_ctx: AppContext) -> None:
    bob = Actor("bob", "dashboard 10.0.0.8")
    seen: list[Actor] = []
    with acting_as(ALICE):
        record(app_ctx, "test.outer", "a")
        with acting_as(bob):
            record(app_ctx, "test.inner", "b")
        record(app_ctx, "test.outer_again", "c")
        other = threading.Thread(target=lambda: seen.append(current_actor()))  # a thread starts with nobody
        other.start()
        other.join()
    record(app_ctx, "test.after", "d")
    events = list(reversed(list_audit(app_ctx)))
    assert [(e.action, e.actor) for e in events] == [
        ("test.outer", ALICE.name),
        ("test.inner", "bob"),
        ("test.outer_again", ALICE.name),
        ("test.after", getpass.getuser()),
    ]
    assert events[1].origin == "dashboard 10.0.0.8"
    assert seen == [local_actor()]


# -- append-only at the database --------------------------------------------------------------


def test_the_database_refuses_to_update_or_delete_audit_rows(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    with acting_as(ALICE):
        event = record(app, audit.ENGINE_RETIRE, "engine 1", {"was": "READY"})
    statements = [
        f"UPDATE audit_events SET actor = 'mallory' WHERE id = {event.id}",
        "UPDATE audit_events SET details = '{}'",
        f"DELETE FROM audit_events WHERE id = {event.id}",
        "DELETE FROM audit_events",
    ]
    if not app.catalog.is_sqlite:
        statements.append("TRUNCATE audit_events")
    for statement in statements:
        refused = pytest.raises(sa.exc.DBAPIError, match="audit_events is append-only")
        with refused, app.catalog.engine.begin() as connection:
            connection.exec_driver_sql(statement)
    refused = pytest.raises(sa.exc.DBAPIError, match="audit_events is append-only")
    with refused, app.catalog.write() as session:  # through the ORM too
        row = session.get(AuditEventRecord, event.id)
        assert row is not None
        row.actor = "mallory"
        session.add(row)
    [kept] = list_audit(app)
    assert (kept.id, kept.actor, kept.origin, kept.details) == (event.id, ALICE.name, ALICE.origin, {"was": "READY"})
    record(app, "test.more", "appending still works")
    assert len(list_audit(app)) == 2


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "catalog.db")
    url: str = request.getfixturevalue("pg_url")
    return url


def _alembic(url: str, step: Callable[[Config, str], None], revision: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))
            config.attributes["connection"] = connection
            step(config, revision)
    finally:
        engine.dispose()


def _audit_objects(url: str) -> tuple[set[str], set[str], set[str]]:
    """The audit table, its indexes and its triggers as the database lists them (and, on PostgreSQL,
    the trigger function among the triggers)."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            inspector = sa.inspect(connection)
            tables = {t for t in inspector.get_table_names() if t == "audit_events"}
            indexes = {i["name"] or "" for i in inspector.get_indexes("audit_events")} if tables else set()
            if connection.dialect.name == "sqlite":
                sql = "SELECT name FROM sqlite_master WHERE type = 'trigger'"
            else:
                sql = (
                    "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal "
                    "UNION SELECT proname FROM pg_proc WHERE proname = 'audit_events_append_only'"
                )
            triggers = {row[0] for row in connection.exec_driver_sql(sql)}
    finally:
        engine.dispose()
    return tables, indexes, triggers


def test_the_migration_adds_the_table_and_triggers_and_removes_them_again(empty_db_url: str) -> None:
    url = empty_db_url
    _alembic(url, command.upgrade, "0009")
    assert _audit_objects(url) == (set(), set(), set())
    _alembic(url, command.upgrade, "0010")
    tables, indexes, triggers = _audit_objects(url)
    assert tables == {"audit_events"} and indexes == {"ix_audit_events_at", "ix_audit_events_action"}
    if url.startswith("sqlite"):
        assert triggers == {"audit_events_no_update", "audit_events_no_delete"}
    else:
        assert triggers == {"audit_events_no_change", "audit_events_no_truncate", "audit_events_append_only"}
    _alembic(url, command.downgrade, "0009")
    assert _audit_objects(url) == (set(), set(), set()), "the downgrade leaves nothing behind"
    _alembic(url, command.upgrade, "head")  # and the upgrade runs again on what the downgrade left
    assert _audit_objects(url)[0] == {"audit_events"}


# -- the CLI ----------------------------------------------------------------------------------


def _cli(app: AppContext) -> typer.Typer:
    """`audit` on a fresh Typer app whose root callback points at `app`'s home and catalog."""
    cli = typer.Typer()

    @cli.callback()
    def root(ctx: typer.Context) -> None:
        ctx.obj = CliSettings(app.home, app.db_url)

    auditcmd.register(cli)
    return cli


def test_cli_audit_json_prints_one_document_newest_first(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    with acting_as(ALICE):
        record(app, audit.MODEL_REGISTER, "model 1", {"name": "mlp"})
        record(app, audit.ENGINE_RETIRE, "engine 2", {"was": "READY"})
    with acting_as(Actor("eve\x1b[2J", "cli box pid 1")):
        record(app, audit.JOB_CANCEL, "job 3")
    cli, runner = _cli(app), CliRunner()

    done = runner.invoke(cli, ["audit", "--json"])
    assert done.exit_code == 0, done.output
    listed = json.loads(done.stdout)  # the whole of stdout is one document
    assert [e["action"] for e in listed] == [audit.JOB_CANCEL, audit.ENGINE_RETIRE, audit.MODEL_REGISTER]
    assert set(listed[0]) == {"id", "at", "actor", "origin", "action", "target", "details"}
    assert (listed[1]["actor"], listed[1]["origin"], listed[1]["target"]) == (ALICE.name, ALICE.origin, "engine 2")
    assert listed[1]["details"] == {"was": "READY"} and listed[1]["at"].endswith("+00:00")

    only = json.loads(runner.invoke(cli, ["audit", "--action", audit.MODEL_REGISTER, "--json"]).stdout)
    assert [e["target"] for e in only] == ["model 1"]
    page = json.loads(runner.invoke(cli, ["audit", "--limit", "1", "--offset", "1", "--json"]).stdout)
    assert [e["id"] for e in page] == [listed[1]["id"]]
    assert json.loads(runner.invoke(cli, ["audit", "--action", "nothing.done", "--json"]).stdout) == []

    text = runner.invoke(cli, ["audit"])
    assert text.exit_code == 0
    lines = text.stdout.splitlines()
    assert len(lines) == 3 and "alice@example.com" in lines[1] and "engine.retire" in lines[1]
    assert "\x1b" not in text.stdout and "eve\\x1b[2J" in lines[0], "control characters are shown escaped"
    assert runner.invoke(cli, ["audit", "--help"]).exit_code == 0


AUDIT_COMMAND_LINE = "The audit log: every change, who made it, when and from where; newest first."


def test_cli_audit_through_the_real_entry_point(
    catalog_ctx: AppContext, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the COMMANDS entry cli/app.py is to get: the root help reads as the module's own, and
    `--json` writes exactly one document to stdout, on success and on a usage error."""
    monkeypatch.setitem(COMMANDS, "audit", ("auditcmd", AUDIT_COMMAND_LINE))
    from_table = run_cli(capsys, "--help")
    monkeypatch.setattr(LazyGroup, "help_from_table", False)
    assert run_cli(capsys, "--help").out == from_table.out  # the entry reads as the module's own help
    monkeypatch.setattr(LazyGroup, "help_from_table", True)

    with acting_as(ALICE):
        record(catalog_ctx, audit.ENGINE_RETIRE, "engine 9")
    where = ["--home", str(catalog_ctx.home), "--db", catalog_ctx.db_url]
    done = run_cli(capsys, *where, "audit", "--json")
    assert done.code == 0, done.err
    assert [(e["actor"], e["target"]) for e in done.json()] == [(ALICE.name, "engine 9")]
    refused = run_cli(capsys, *where, "audit", "--limit", "0", "--json")
    assert refused.code == 2 and refused.json()["kind"] == "usage"


# -- the dashboard ----------------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    """The catalog the dashboard serves; no actor source is left behind for later tests."""
    home = tmp_path / "home"
    serve_home(home, monkeypatch)
    ctx = AppContext.from_settings(home)
    yield ctx
    ctx.close()
    audit.use_actor_source(None)


def test_audit_view_says_when_nothing_is_recorded(served: AppContext) -> None:
    at = view("audit").run()
    assert not at.exception and "No change recorded yet" in at.info[0].value


def test_audit_view_lists_events_newest_first_as_plain_text_and_filters_by_action(served: AppContext) -> None:
    hostile = Actor("<img src=x onerror=alert(1)> [x](http://evil)", "dashboard 10.0.0.9")
    with acting_as(hostile):
        record(served, audit.MODEL_REGISTER, "model 1", {"name": "**bold**"})
        record(served, audit.ENGINE_RETIRE, "engine 2", {"was": "READY"})
    at = view("audit").run()
    assert not at.exception
    table = frame(at, "actor", "origin", "action", "target", "details")
    assert table["action"].tolist() == [audit.ENGINE_RETIRE, audit.MODEL_REGISTER]
    assert table["actor"].tolist() == [hostile.name] * 2, "a table shows the string itself"
    assert table.loc[1, "details"] == '{"name": "**bold**"}' and table.loc[0, "target"] == "engine 2"
    at.selectbox(key="audit_action").set_value(audit.MODEL_REGISTER).run()
    assert frame(at, "actor", "action")["target"].tolist() == ["model 1"]


def test_the_router_runs_each_page_as_the_streamlit_user(served: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """dashboard.app's `acting_as` is in effect in the view the router runs (the Audit view, made
    the default page here, says whom it records)."""
    views = dashboard_app.VIEWS
    monkeypatch.setattr(dashboard_app, "VIEWS", tuple(sorted(views, key=lambda v: v[0] != "audit")))
    _grant(served, "alice@example.com")  # the Audit view is for admins
    _grant(served, "[Bob](http://evil)")
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.user = {"is_logged_in": True, "email": "alice@example.com", "name": "Alice"}
    at.run()
    assert not at.exception and at.title[0].value == "Audit"
    assert f"recorded as {markdown_literal('alice@example.com')} (dashboard)" in at.caption[0].value
    at.user = {"is_logged_in": True, "name": "[Bob](http://evil)"}  # no e-mail: the name, escaped
    at.run()
    assert f"recorded as {markdown_literal('[Bob](http://evil)')} (dashboard)" in at.caption[0].value
    at.user = {"is_logged_in": False}
    at.run()
    assert f"recorded as {markdown_literal(dashboard_app.NO_LOGIN)} (dashboard)" in at.caption[0].value
    assert current_actor() == local_actor(), "outside a script run nobody is named: the OS user"


# Code a script run reaches outside the `acting_as` of its entry point: a fragment's own rerun (the
# Build view's job cards after Cancel) runs the fragment alone, in a new script thread, without
# dashboard.app's script around it (Streamlit's ScriptRunner, fragment_id_queue). AppTest reruns
# whole scripts only, so the script here records outside its `acting_as` itself.
OUTSIDE_SCRIPT = """
from enginecache.dashboard import app
from enginecache.service import audit
from enginecache.service.context import AppContext

ctx = AppContext.from_settings()
audit.use_actor_source(app.script_run_actor if USE_SOURCE else None)
with audit.acting_as(app.session_actor()):
    audit.record(ctx, "test.run", "inside acting_as")
audit.record(ctx, "test.run", "outside acting_as")
ctx.close()
"""


@pytest.mark.parametrize("use_source", [True, False])
def test_a_script_run_outside_acting_as_is_recorded_as_the_streamlit_user(served: AppContext, use_source: bool) -> None:
    """With dashboard.app's actor source, as main() sets it, code outside its `acting_as` still
    records the session's user; without it, that would have been the server's OS user."""
    at = AppTest.from_string(f"USE_SOURCE = {use_source}\n" + OUTSIDE_SCRIPT, default_timeout=TIMEOUT)
    at.user = {"is_logged_in": True, "email": "carol@example.com"}
    at.run()
    assert not at.exception
    outside = ("carol@example.com", "dashboard") if use_source else (local_actor().name, local_actor().origin)
    assert [(e.target, e.actor, e.origin) for e in reversed(list_audit(served))] == [
        ("inside acting_as", "carol@example.com", "dashboard"),
        ("outside acting_as", *outside),
    ]


def test_an_in_process_build_and_a_corrupt_engine_met_by_load_or_build_are_audited(
    catalog_ctx: AppContext, tmp_path: Path
) -> None:
    from enginecache.errors import EngineRejectedError
    from enginecache.service.runtime import load_or_build
    from enginecache.service.runtimetypes import RuntimeSpec
    from tests.conftest import corrupt_blob
    from tests.modelfactory import make_mlp

    app = catalog_ctx
    onnx_path = make_mlp(tmp_path / "served.onnx", seed=11)
    loaded = load_or_build(onnx_path, spec=RuntimeSpec(backend="ort"), app=app)  # a miss: built here
    engine_id = loaded.engine_id
    loaded.close()
    (built,) = list_audit(app, action=audit.BUILD_RUN)
    assert built.target == f"engine {engine_id}" and built.actor == local_actor().name
    assert built.details["backend"] == "ort"
    corrupt_blob(blob_path(app.home, get_engine(app, engine_id).sha256))
    with pytest.raises(EngineRejectedError, match="CORRUPT"):
        load_or_build(onnx_path, spec=RuntimeSpec(backend="ort"), app=app, on_miss="fail")
    (marked,) = list_audit(app, action=audit.ENGINE_CORRUPT)
    assert marked.target == f"engine {engine_id}" and marked.details == {"via": "load_or_build"}
