"""The dashboard's Audit view (plain text, newest first, filtered by action), and the Streamlit user
each script run records as, inside and outside the `acting_as` of its entry point."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.core.plaintext import markdown_literal
from enginecache.dashboard import app as dashboard_app
from enginecache.service.access import audit
from enginecache.service.access.audit import Actor, acting_as, current_actor, list_audit, local_actor, record
from enginecache.service.context import AppContext
from tests.auditkit import grant_role
from tests.dashboardkit import TIMEOUT, frame, served_catalog, view


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    """The catalog the dashboard serves; no actor source is left behind for later tests."""
    with served_catalog(tmp_path / "home", monkeypatch) as ctx:
        yield ctx
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
    table = frame(at, "actor", "origin", "action", "target", "change", "details")
    assert table["action"].tolist() == [audit.ENGINE_RETIRE, audit.MODEL_REGISTER]
    assert table["actor"].tolist() == [hostile.name] * 2, "a table shows the string itself"
    assert table.loc[1, "details"] == "name: **bold**" and table.loc[0, "target"] == "engine 2"
    assert table.loc[0, "change"] == "status: READY -> RETIRED" and table.loc[0, "details"] == ""
    at.selectbox(key="audit_action").set_value(audit.MODEL_REGISTER).run()
    assert frame(at, "actor", "action")["target"].tolist() == ["model 1"]


def test_the_router_runs_each_page_as_the_streamlit_user(served: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """dashboard.app's `acting_as` is in effect in the view the router runs (the Audit view, made
    the default page here, says whom it records)."""
    views = dashboard_app.VIEWS
    monkeypatch.setattr(dashboard_app, "VIEWS", tuple(sorted(views, key=lambda v: v[0] != "audit")))
    grant_role(served, "alice@example.com")  # the Audit view is for admins
    grant_role(served, "[Bob](http://evil)")
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.user = {"is_logged_in": True, "email": "alice@example.com", "email_verified": True, "name": "Alice"}
    at.run()
    assert not at.exception and at.title[0].value == "Audit"
    assert f"recorded as {markdown_literal('alice@example.com')} (dashboard)" in at.caption[0].value
    at.user = {"is_logged_in": True, "sub": "[Bob](http://evil)", "name": "Bob"}  # no e-mail: the subject, escaped
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
from enginecache.service.access import audit
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
    at.user = {"is_logged_in": True, "email": "carol@example.com", "email_verified": True}
    at.run()
    assert not at.exception
    outside = ("carol@example.com", "dashboard") if use_source else (local_actor().name, local_actor().origin)
    assert [(e.target, e.actor, e.origin) for e in reversed(list_audit(served))] == [
        ("inside acting_as", "carol@example.com", "dashboard"),
        ("outside acting_as", *outside),
    ]
