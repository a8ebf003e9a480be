"""Audit details for people (issue 28, point 6): what a change moved reads `field: old -> new`, the
rest `field: value`, in the Audit view's table and in the one event it shows whole, never raw JSON
(`service.access.auditdiff`). The events are the real ones the service writes: a promote and a
roll back (whose rows now say where the alias pointed before), a role granted and changed, an
engine retired."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.service.access import audit
from enginecache.service.access.auditdiff import readable_details
from enginecache.service.access.roles import Role, set_role
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import promote, rollback
from tests.dashboardkit import frame, plain, served_catalog, texts, view
from tests.modelfactory import make_mlp


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    with served_catalog(tmp_path / "home", monkeypatch) as ctx:
        yield ctx
    audit.use_actor_source(None)


def _readable(app: AppContext, action: str) -> list[tuple[str, str]]:
    """(change, rest) of each `action` event, oldest first."""
    events = reversed(audit.list_audit(app, action=action, limit=None))
    return [(r.change, r.rest) for r in (readable_details(e.action, e.details) for e in events)]


def test_promote_rollback_and_roles_read_as_old_to_new(served: AppContext, tmp_path: Path) -> None:
    v1 = register_model(served, make_mlp(tmp_path / "a.onnx", seed=1), name="m").model.id
    v2 = register_model(served, make_mlp(tmp_path / "b.onnx", seed=2), name="m", new_version=True).model.id
    promote(served, "m", "prod", version=1)
    promote(served, "m", "prod", version=2)
    rollback(served, "m", "prod")
    promote(served, "m", "canary", version=2, gpu_class="sm86")
    assert [c for c, _ in _readable(served, audit.RELEASE_PROMOTE)] == [
        f"prod: - -> v1 (model {v1})",
        f"prod: v1 (model {v1}) -> v2 (model {v2})",
        f"canary for sm86: - -> v2 (model {v2})",
    ]
    assert _readable(served, audit.RELEASE_ROLLBACK) == [(f"prod: v2 (model {v2}) -> v1 (model {v1})", "name: m")]
    set_role(served, "bob@example.com", Role.VIEWER)
    set_role(served, "bob@example.com", Role.OPERATOR)
    assert [c for c, _ in _readable(served, audit.ROLE_SET)] == ["role: - -> viewer", "role: viewer -> operator"]


def test_the_audit_view_shows_the_change_and_one_event_whole(served: AppContext) -> None:
    reason = "blob sha256 abc does not match: chunk 7 of 9 differs " + "x" * 200
    audit.record(served, audit.ENGINE_CORRUPT, "engine 4", {"by": "verify", "was": "READY", "reason": reason})
    at = view("audit").run()
    assert not at.exception
    [row] = frame(at, "action", "change", "details").to_dict("records")
    assert row["change"] == "status: READY -> CORRUPT"
    assert row["details"] == f"by: verify; reason: {reason}"
    assert "{" not in row["details"], "no JSON"
    shown = plain(texts(at))
    assert "status: READY -> CORRUPT" in shown and reason in shown, "the whole reason below the table"
