"""Releases (`service.models.releases`, `enginecache release`): a name's versions are its registered bytes in
order; aliases point a name at a version, for every host or one GPU class; promote and rollback (a
stack), audited, the operator role; `NAME@ALIAS` resolved by profiles and pull (its manifest says the
alias and version); bad aliases and versions refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.errors import AccessDeniedError, BadInputError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.access.audit import Actor, acting_as
from enginecache.service.access.roles import Role, set_role
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.profiles import model_profiles
from enginecache.service.fleet.pull import pull
from enginecache.service.models.register import ModelRecord, register_model
from enginecache.service.models.releases import aliases, promote, resolve_alias, resolve_model, rollback, versions
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp
from tests.test_profiles import fake_gpu_host


@pytest.fixture
def two_versions(app_ctx: AppContext, tmp_path: Path) -> list[ModelRecord]:
    first = register_model(app_ctx, make_mlp(tmp_path / "v1" / "m.onnx", seed=1), name="m").model
    second = register_model(app_ctx, make_mlp(tmp_path / "v2" / "m.onnx", seed=2), name="m", new_version=True).model
    return [first, second]


def test_versions_are_the_names_registered_bytes_in_order(app_ctx: AppContext, two_versions: list[ModelRecord]) -> None:
    assert [m.id for m in versions(app_ctx, "m")] == [m.id for m in two_versions]
    assert resolve_model(app_ctx, "m")[0].id == two_versions[1].id, "the name alone is the newest version"


def test_promote_and_rollback_are_a_stack_and_audited(app_ctx: AppContext, two_versions: list[ModelRecord]) -> None:
    v1, v2 = two_versions
    assert promote(app_ctx, "m", "prod", version=1).model_id == v1.id
    assert promote(app_ctx, "m", "prod").version == 2, "default: the newest"
    assert resolve_alias(app_ctx, "m", "prod").model_id == v2.id
    back = rollback(app_ctx, "m", "prod")
    assert (back.model_id, back.version) == (v1.id, 1)
    assert resolve_model(app_ctx, "m@prod")[0].id == v1.id
    with pytest.raises(BadInputError, match="no earlier target"):
        rollback(app_ctx, "m", "prod")
    actions = [e.action for e in audit.list_audit(app_ctx) if e.action.startswith("release.")]
    assert actions == [audit.RELEASE_ROLLBACK, audit.RELEASE_PROMOTE, audit.RELEASE_PROMOTE]
    assert [(a.alias, a.version) for a in aliases(app_ctx, "m")] == [("prod", 1)]


def test_an_alias_for_one_gpu_class_overrides_the_fleet_wide_one_fake_gpu_host(
    app_ctx: AppContext, two_versions: list[ModelRecord]
) -> None:
    v1, v2 = two_versions
    promote(app_ctx, "m", "prod", version=1)
    promote(app_ctx, "m", "prod", version=2, gpu_class="SM86")
    assert resolve_alias(app_ctx, "m", "prod", fake_gpu_host("sm86")).model_id == v2.id
    assert resolve_alias(app_ctx, "m", "prod", fake_gpu_host("sm89")).model_id == v1.id
    assert resolve_alias(app_ctx, "m", "prod", fake_gpu_host("sm86").replace(gpus=())).model_id == v1.id
    assert [(a.gpu_class, a.version) for a in aliases(app_ctx, "m")] == [("", 1), ("sm86", 2)]


def test_bad_aliases_versions_and_unset_aliases_are_refused(
    app_ctx: AppContext, two_versions: list[ModelRecord]
) -> None:
    for alias in ("", "1st", "a b", "x" * 65, "pröd"):
        with pytest.raises(BadInputError, match="is not one"):
            promote(app_ctx, "m", alias)
    with pytest.raises(BadInputError, match="versions 1 to 2, not 3"):
        promote(app_ctx, "m", "prod", version=3)
    with pytest.raises(BadInputError, match="compute capability"):
        promote(app_ctx, "m", "prod", gpu_class="ampere")
    with pytest.raises(NotFoundError, match="no model named 'nope'"):
        promote(app_ctx, "nope", "prod")
    with pytest.raises(NotFoundError, match="m@canary is not set"):
        resolve_model(app_ctx, "m@canary")
    assert aliases(app_ctx, "m") == []


def test_moving_an_alias_needs_the_operator_role(app_ctx: AppContext, two_versions: list[ModelRecord]) -> None:
    set_role(app_ctx, "viewer@example.com", Role.VIEWER)
    set_role(app_ctx, "op@example.com", Role.OPERATOR)
    with acting_as(Actor("viewer@example.com", "dashboard", local=False)), pytest.raises(AccessDeniedError):
        promote(app_ctx, "m", "prod")
    assert aliases(app_ctx, "m") == []
    with acting_as(Actor("op@example.com", "dashboard", local=False)):
        assert promote(app_ctx, "m", "prod").version == 2
    [event] = audit.list_audit(app_ctx, action=audit.RELEASE_PROMOTE)
    assert event.actor == "op@example.com"


def test_profiles_and_pull_resolve_name_at_alias(
    app_ctx: AppContext, two_versions: list[ModelRecord], tmp_path: Path
) -> None:
    v1, _ = two_versions
    old = build_engine(app_ctx, BuildRequest(model=str(v1.id), backend="ort")).engine
    build_engine(app_ctx, BuildRequest(model="m", backend="ort"))  # the newest version's engine
    promote(app_ctx, "m", "prod", version=1)
    found = model_profiles(app_ctx, "m@prod")
    assert found.model_id == v1.id and found.selected is not None and found.selected.engine_id == old.id
    assert found.to_dict()["release"]["alias"] == "prod"
    result = pull(app_ctx, "m@prod", tmp_path / "engines")
    assert result.engine_id == old.id
    assert result.manifest["release"] == {"alias": "prod", "gpu_class": "", "version": 1}


def test_the_release_cli(
    app_ctx: AppContext, two_versions: list[ModelRecord], capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    done = run_cli(capsys, *where, "release", "promote", "m", "--alias", "canary", "--json")
    assert done.code == 0, done.err
    assert done.json()["version"] == 2 and done.json()["gpu_class"] is None
    run_cli(capsys, *where, "release", "promote", "m", "--alias", "canary", "--version", "1")
    listed = run_cli(capsys, *where, "release", "list", "m")
    assert listed.code == 0 and "m@canary -> version 1" in listed.out
    back = run_cli(capsys, *where, "release", "rollback", "m", "--alias", "canary", "--json")
    assert back.code == 0 and back.json()["version"] == 2
    refused = run_cli(capsys, *where, "release", "rollback", "m", "--alias", "canary")
    assert refused.code == 2 and refused.err.startswith("error: ")


def test_export_and_the_startup_probe_resolve_name_at_alias(
    app_ctx: AppContext, two_versions: list[ModelRecord], tmp_path: Path
) -> None:
    from enginecache.service.fleet.exports import export_model
    from enginecache.service.serving.readiness import check_ready
    from enginecache.service.serving.runtime import RuntimeSpec

    v1, _ = two_versions
    old = build_engine(app_ctx, BuildRequest(model=str(v1.id), backend="ort")).engine
    new = build_engine(app_ctx, BuildRequest(model="m", backend="ort")).engine
    promote(app_ctx, "m", "prod", version=1)
    ready = check_ready(app_ctx, "m@prod", RuntimeSpec(backend="ort"))
    assert ready.ready and ready.engine_id == old.id, ready.reason
    assert check_ready(app_ctx, "m", RuntimeSpec(backend="ort")).engine_id == new.id, "the name alone: newest"
    exported = export_model(app_ctx, "m@prod", tmp_path / "tree", fmt="tree", backend="ort")
    assert [e["sha256"] for e in exported.manifest["engines"]] == [old.sha256]
