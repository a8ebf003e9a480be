"""Register a new version from the dashboard (issue 28, point 1): new bytes uploaded under a name a
source model holds are refused until the operator ticks "Register as a new version of NAME", which
registers them as version N+1 through the service call `model add --new-version` makes, audited;
the refusal names that box, not the CLI's flags."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.service.access import audit
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import versions
from tests.dashboardkit import frame, plain, served_catalog, view
from tests.modelfactory import make_mlp


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    """A catalog holding `mlp` v1."""
    with served_catalog(tmp_path / "home", monkeypatch) as ctx:
        register_model(ctx, make_mlp(tmp_path / "v1" / "mlp.onnx", seed=1), name="mlp")
        yield ctx


def _upload(at: object, path: Path) -> None:
    at.get("file_uploader")[0].upload(path.name, path.read_bytes()).run()  # type: ignore[attr-defined]


def test_new_bytes_under_a_taken_name_become_its_next_version_once_the_box_is_ticked(
    catalog: AppContext, tmp_path: Path
) -> None:
    v2 = make_mlp(tmp_path / "v2" / "mlp.onnx", seed=2)  # the file's own stem is the taken name
    at = view("models").run()
    _upload(at, v2)
    box = at.checkbox(key="models_upload_new_version")
    assert box.label == "Register as a new version of mlp (v2)" and not box.value
    at.button(key="models_upload_submit").click().run()
    assert not at.exception
    [error] = [plain(e.value) for e in at.error]
    assert 'tick "Register as a new version of mlp"' in error and "--new-version" not in error, error
    assert len(versions(catalog, "mlp")) == 1, "nothing registered unasked"

    at.checkbox(key="models_upload_new_version").check().run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    held = versions(catalog, "mlp")
    assert len(held) == 2
    assert any(f"Registered: mlp v2 (id {held[1].id})" in plain(s.value) for s in at.success)
    assert frame(at, "name", "version", "kind")["version"].tolist() == ["2", "1"]
    assert at.selectbox(key="models_detail").value == held[1].id, "the new version's page opens"
    [event] = audit.list_audit(catalog, action=audit.MODEL_REGISTER, limit=1)
    assert event.target == f"model {held[1].id}" and event.details["new_version"] is True


def test_a_typed_taken_name_offers_the_box_and_a_free_name_does_not(catalog: AppContext, tmp_path: Path) -> None:
    other = make_mlp(tmp_path / "other.onnx", seed=3)
    at = view("models").run()
    _upload(at, other)
    assert not at.checkbox, "other is a free name"
    at.text_input(key="models_upload_name").set_value("mlp").run()
    at.checkbox(key="models_upload_new_version").check().run()
    at.button(key="models_upload_submit").click().run()
    assert not at.exception and not at.error
    assert [m.filename for m in versions(catalog, "mlp")] == ["mlp.onnx", "other.onnx"]


def test_the_build_and_models_selectors_name_each_version(catalog: AppContext, tmp_path: Path) -> None:
    """Two versions under one label were one option to a selector: choosing v2 acted on v1."""
    register_model(catalog, make_mlp(tmp_path / "v2" / "mlp.onnx", seed=2), name="mlp", new_version=True)
    held = versions(catalog, "mlp")
    build = view("build").run()
    box = build.selectbox(key="build_model")
    assert sorted(box.options) == ["mlp v1", "mlp v2"]
    box.set_value(held[1].id).run()
    assert not build.exception and build.selectbox(key="build_model").value == held[1].id
    models = view("models").run()
    assert sorted(models.selectbox(key="models_detail").options) == ["mlp v1", "mlp v2"]
