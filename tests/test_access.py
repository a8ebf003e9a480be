"""Roles (`service.access.roles`, table `user_roles`): viewer < operator < admin, deny by default for a
logged-in user, the local admin for the CLI and this machine's processes; every use case that changes
something checks the current actor's role again on each call, and writes nothing when refused; the
`role` CLI group; the dashboard re-reading the role on every rerun and hiding what it may not do."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from enginecache.core.plaintext import markdown_literal
from enginecache.dashboard import app as dashboard_app
from enginecache.dashboard.views.build import BUILD_ROLE_CAPTION
from enginecache.dashboard.views.models import SERVER_PATH_TAB, register_server_path
from enginecache.db.models import AuditEventRecord, EngineRecord, JobRecord, ModelRecord, UserRoleRecord
from enginecache.errors import EXIT_BAD_INPUT, AccessDeniedError, BadInputError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access.audit import Actor, acting_as, list_audit, local_actor
from enginecache.service.access.roles import (
    PERMISSIONS,
    Role,
    list_roles,
    remove_role,
    require,
    role_of,
    set_role,
)
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.submit import cancel_job, submit_build
from enginecache.service.builds.testload import submit_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.delete import delete_engine
from enginecache.service.engines.records import retire_engine
from enginecache.service.maintenance.backup.usecases import backup, restore
from enginecache.service.maintenance.gc.collect import collect_garbage
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.dashboardkit import TIMEOUT, Seeded
from tests.test_dashboard_login import AUTH

# The table, by role: what each role may do beyond the one below it.
ADDED_BY_ROLE = {
    Role.VIEWER: {"browse", "download"},
    Role.OPERATOR: {"upload", "build", "cancel", "test_load", "release", "import"},
    Role.ADMIN: {"retire", "delete", "gc", "backup", "restore", "server_path", "roles", "sign"},
}
EXPECTED = {permission: role for role, permissions in ADDED_BY_ROLE.items() for permission in permissions}


def user(email: str) -> Actor:
    """A logged-in dashboard user (not local)."""
    return Actor(email, "dashboard 10.0.0.5", local=False)


# -- roles, the table, deny by default ------------------------------------------------------------


def test_roles_are_ordered_and_each_permission_names_the_least_role() -> None:
    assert Role.VIEWER < Role.OPERATOR < Role.ADMIN and max(Role) == Role.ADMIN
    assert sorted([Role.ADMIN, Role.VIEWER, Role.OPERATOR]) == [Role.VIEWER, Role.OPERATOR, Role.ADMIN]
    assert not Role.ADMIN < Role.VIEWER and Role.ADMIN >= Role.ADMIN and Role.VIEWER <= Role.OPERATOR
    assert PERMISSIONS == EXPECTED


def test_local_actors_are_admin_and_a_named_actor_is_not_local() -> None:
    assert local_actor().local and not Actor("someone", "dashboard").local
    assert audit.current_actor().local, "nobody named: the OS user, the local admin"


def test_the_role_table_denies_by_default_and_stores_subjects_lowercased(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    carol = user("Carol@Example.com")
    assert role_of(app, carol) is None, "no row: no role"
    assert role_of(app, local_actor()) == Role.ADMIN
    with acting_as(carol), pytest.raises(AccessDeniedError, match=r"Carol@Example.com \(no role\) may not browse"):
        require(app, "browse")

    row = set_role(app, " CAROL@example.COM ", "operator")
    assert (row.subject, row.role, row.granted_by) == ("carol@example.com", "operator", local_actor().name)
    assert role_of(app, carol) == Role.OPERATOR and role_of(app, user("carol@example.com")) == Role.OPERATOR
    set_role(app, "carol@example.com", Role.OPERATOR)  # the same role again: nothing changed, not recorded
    set_role(app, "dave@example.com", Role.VIEWER)
    assert [(r.subject, r.role) for r in list_roles(app)] == [
        ("carol@example.com", "operator"),
        ("dave@example.com", "viewer"),
    ]
    with app.catalog.read() as session:
        stored = session.get(UserRoleRecord, "carol@example.com")
        assert stored is not None and stored.granted_at.tzinfo is not None

    with pytest.raises(BadInputError, match="not a role"):
        set_role(app, "carol@example.com", "root")
    with pytest.raises(BadInputError, match="not a user"):
        set_role(app, "two words", "viewer")
    assert role_of(app, carol) == Role.OPERATOR, "a refused change leaves the role as it was"

    removed = remove_role(app, "CAROL@example.com")
    assert removed.role == "operator" and role_of(app, carol) is None
    with pytest.raises(NotFoundError, match="no role to remove"):
        remove_role(app, "carol@example.com")
    events = [(e.action, e.target, e.details) for e in reversed(list_audit(app))]
    assert events == [
        (audit.ROLE_SET, "user carol@example.com", {"role": "operator", "was": None}),
        (audit.ROLE_SET, "user dave@example.com", {"role": "viewer", "was": None}),
        (audit.ROLE_REMOVE, "user carol@example.com", {"was": "operator"}),
    ]


def test_the_database_refuses_a_role_outside_the_three(app_ctx: AppContext) -> None:
    import sqlalchemy as sa

    with pytest.raises(sa.exc.IntegrityError), app_ctx.catalog.write() as session:
        session.add(UserRoleRecord(subject="x@example.com", role="root", granted_by="test"))


def test_require_allows_each_permission_to_its_role_and_above_only(app_ctx: AppContext) -> None:
    for role in Role:
        set_role(app_ctx, f"{role.value}@example.com", role)
    for permission, least in EXPECTED.items():
        for role in Role:
            with acting_as(user(f"{role.value}@example.com")):
                if role >= least:
                    assert require(app_ctx, permission) == role
                else:
                    with pytest.raises(AccessDeniedError) as refused:
                        require(app_ctx, permission)
                    message = str(refused.value)
                    assert f"{role.value}@example.com (role {role.value})" in message and least.value in message
                    assert refused.value.exit_code == EXIT_BAD_INPUT and refused.value.kind == "forbidden"
        with acting_as(local_actor()):
            assert require(app_ctx, permission) == Role.ADMIN


# -- the service layer refuses, and writes nothing ----------------------------------------------------


def _counts(app: AppContext) -> tuple[int, ...]:
    with app.catalog.read() as session:
        return tuple(
            len(session.exec(select(table)).all())
            for table in (ModelRecord, EngineRecord, JobRecord, AuditEventRecord, UserRoleRecord)
        )


def test_service_calls_refuse_a_viewer_and_write_nothing(catalog_ctx: AppContext, mlp: Path, tmp_path: Path) -> None:
    app = catalog_ctx
    model = register_model(app, mlp, name="mlp").model  # as the local admin
    engine = build_engine(app, BuildRequest(model="mlp", backend="ort")).engine
    queued = submit_build(app, BuildRequest(model="mlp", backend="ort", precision="fp16"))
    assert queued.job is not None
    job_id = queued.job.id or 0
    set_role(app, "viewer@example.com", Role.VIEWER)
    set_role(app, "op@example.com", Role.OPERATOR)
    before = _counts(app)
    with acting_as(user("viewer@example.com")):
        refused: list[Callable[[], object]] = [
            lambda: register_model(app, mlp, name="mlp2"),
            lambda: submit_build(app, BuildRequest(model="mlp", backend="ort", precision="int8")),
            lambda: cancel_job(app, job_id),
            lambda: submit_test_load(app, engine.id or 0, iterations=1),
            lambda: retire_engine(app, engine.id or 0),
            lambda: delete_engine(app, engine.id or 0),
            lambda: collect_garbage(app, apply=True),
            lambda: backup(app, tmp_path / "backup"),
            lambda: restore(app, tmp_path / "no-backup"),
            lambda: set_role(app, "viewer@example.com", Role.ADMIN),
            lambda: remove_role(app, "op@example.com"),
            lambda: list_roles(app),
            lambda: register_server_path(app, str(mlp), name=None, roots=(mlp.parent,)),
        ]
        for call in refused:
            with pytest.raises(AccessDeniedError, match=r"viewer@example.com \(role viewer\)"):
                call()
        assert not collect_garbage(app, apply=False).applied, "a dry run only reads: a viewer may"
    assert _counts(app) == before, "nothing written, not even an audit row"
    assert not (tmp_path / "backup").exists()
    with app.catalog.read() as session:
        job = session.get(JobRecord, job_id)
        kept = session.get(EngineRecord, engine.id)
        assert job is not None and job.status == "QUEUED" and not job.cancel_requested
        assert kept is not None and kept.status == "READY"

    with acting_as(user("op@example.com")):  # an operator uploads, builds, cancels, test-loads
        assert register_model(app, mlp, name="mlp").model.id == model.id
        assert cancel_job(app, job_id).status == "CANCELLED"
        assert submit_test_load(app, engine.id or 0, iterations=1).id is not None
        admin_only: list[Callable[[], object]] = [
            lambda: retire_engine(app, engine.id or 0),
            lambda: delete_engine(app, engine.id or 0),
            lambda: register_server_path(app, str(mlp), name=None, roots=(mlp.parent,)),
        ]
        for call in admin_only:
            with pytest.raises(AccessDeniedError, match=r"op@example.com \(role operator\) .* admin"):
                call()
    set_role(app, "op@example.com", Role.ADMIN)
    with acting_as(user("op@example.com")):
        assert retire_engine(app, engine.id or 0).status == "RETIRED"
        assert register_server_path(app, str(mlp), name=None, roots=(mlp.parent,)).model.id == model.id
    set_role(app, "op@example.com", Role.VIEWER)  # taken down: the next call is refused
    with acting_as(user("op@example.com")), pytest.raises(AccessDeniedError):
        register_model(app, mlp)


# -- the CLI -------------------------------------------------------------------------------------------


def test_cli_role_commands(app_ctx: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    where = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    done = run_cli(capsys, *where, "role", "set", "Eve@Example.com", "admin", "--json")
    assert done.code == 0, done.err
    assert done.json()["subject"] == "eve@example.com" and done.json()["role"] == "admin"
    run_cli(capsys, *where, "role", "set", "zed@example.com", "viewer", "--json")
    listed = run_cli(capsys, *where, "role", "list", "--json")
    assert [(r["subject"], r["role"]) for r in listed.json()] == [
        ("eve@example.com", "admin"),
        ("zed@example.com", "viewer"),
    ]
    text = run_cli(capsys, *where, "role", "list")
    assert text.code == 0 and "eve@example.com" in text.out and "zed@example.com" in text.out
    refused = run_cli(capsys, *where, "role", "set", "zed@example.com", "superuser", "--json")
    assert refused.code == 2 and refused.json()["kind"] == "bad_input"
    gone = run_cli(capsys, *where, "role", "remove", "zed@example.com", "--json")
    assert gone.code == 0 and gone.json()["removed"] is True and gone.json()["role"] == "viewer"
    missing = run_cli(capsys, *where, "role", "remove", "zed@example.com", "--json")
    assert missing.code == 2 and missing.json()["kind"] == "not_found"
    assert json.loads(run_cli(capsys, *where, "role", "list", "--json").out)[0]["subject"] == "eve@example.com"
    actions = [e.action for e in reversed(list_audit(app_ctx))]
    assert actions == [audit.ROLE_SET, audit.ROLE_SET, audit.ROLE_REMOVE]
    assert {e.actor for e in list_audit(app_ctx)} == {local_actor().name}, "the CLI acts as the OS user"


# -- the dashboard --------------------------------------------------------------------------------------


@pytest.fixture
def router(seeded: Seeded) -> Iterator[Seeded]:
    """The seeded catalog served to the router; no actor source is left behind for later tests."""
    yield seeded
    audit.use_actor_source(None)


def _open(monkeypatch: pytest.MonkeyPatch, email: str, module: str) -> AppTest:
    """A new session of the router, a login configured, `email` logged in, on `module`'s view (made
    the default page: a session keeps the page it is on)."""
    views = dashboard_app.VIEWS
    monkeypatch.setattr(dashboard_app, "VIEWS", tuple(sorted(views, key=lambda v: v[0] != module)))
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": email, "email_verified": True, "exp": time.time() + 3600}
    at.run()
    assert not at.exception
    return at


def _texts(at: AppTest) -> str:
    return " ".join(str(e.value) for e in [*at.error, *at.caption, *at.info, *at.markdown])


@pytest.mark.slow
def test_a_logged_in_user_without_a_role_sees_only_that_they_have_none(
    router: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = _open(monkeypatch, "nobody@example.com", "build")
    assert [t.value for t in at.title] == ["enginecache"], "no page of the dashboard ran"
    [error] = at.error
    assert "has no role on this dashboard; ask an admin" in error.value
    assert markdown_literal("nobody@example.com") in error.value
    assert [b.label for b in at.button] == ["Log out"]


def test_a_viewer_browses_but_cannot_build_upload_or_retire(router: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    set_role(router.app, "viewer@example.com", Role.VIEWER)
    monkeypatch.setenv("ENGINECACHE_IMPORT_ROOTS", str(router.model_file.parent))
    at = _open(monkeypatch, "viewer@example.com", "build")
    assert at.title[0].value == "Build"
    submit = at.button(key="build_submit")
    assert submit.label.startswith("Submit ") and submit.label.endswith(" build(s)") and submit.disabled
    assert BUILD_ROLE_CAPTION in [c.value for c in at.caption]

    at = _open(monkeypatch, "viewer@example.com", "models")
    assert at.title[0].value == "Models"
    assert not at.get("file_uploader") and SERVER_PATH_TAB not in [t.label for t in at.tabs]
    assert "models_upload_submit" not in [b.key for b in at.button]

    at = _open(monkeypatch, "viewer@example.com", "engines")
    assert at.title[0].value == "Engines"
    keys = [b.key for b in at.button]
    assert "engines_verify" in keys and "engines_retire" not in keys
    assert at.button(key="engines_testload").disabled

    at = _open(monkeypatch, "viewer@example.com", "audit")  # not listed for a viewer: the next page opens
    assert at.title[0].value != "Audit"


def test_an_operator_submits_builds_and_uploads_but_gets_no_server_path(
    router: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_role(router.app, "op@example.com", Role.OPERATOR)
    monkeypatch.setenv("ENGINECACHE_IMPORT_ROOTS", str(router.model_file.parent))
    at = _open(monkeypatch, "op@example.com", "models")
    assert [t.label for t in at.tabs] == ["Upload"] and at.get("file_uploader")

    at = _open(monkeypatch, "op@example.com", "build")
    at.multiselect(key="build_targets").set_value(["TensorRT-RTX sm89"]).run()
    submit = at.button(key="build_submit")
    assert submit.label == "Submit 1 build(s)" and not submit.disabled
    assert BUILD_ROLE_CAPTION not in [c.value for c in at.caption]
    submit.click().run()
    assert not at.exception
    with router.app.catalog.read() as session:
        jobs = session.exec(select(JobRecord).where(JobRecord.status == "QUEUED")).all()
    assert [j.payload["targets"] for j in jobs] == [["sm89"]]
    [event] = list_audit(router.app, action=audit.BUILD_SUBMIT)
    assert event.actor == "op@example.com"


def test_an_admin_gets_the_audit_view_the_server_path_and_retire(
    router: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_role(router.app, "boss@example.com", Role.ADMIN)
    monkeypatch.setenv("ENGINECACHE_IMPORT_ROOTS", str(router.model_file.parent))
    assert _open(monkeypatch, "boss@example.com", "audit").title[0].value == "Audit"
    at = _open(monkeypatch, "boss@example.com", "models")
    assert [t.label for t in at.tabs] == ["Upload", SERVER_PATH_TAB]
    assert "engines_retire" in [b.key for b in _open(monkeypatch, "boss@example.com", "engines").button]


def test_a_user_whose_role_is_removed_is_blocked_on_the_next_rerun(
    router: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    set_role(router.app, "op@example.com", Role.OPERATOR)
    at = _open(monkeypatch, "op@example.com", "build")
    assert at.title[0].value == "Build"
    remove_role(router.app, "op@example.com")
    at.run()
    assert not at.exception and [t.value for t in at.title] == ["enginecache"]
    assert "has no role on this dashboard" in _texts(at)
