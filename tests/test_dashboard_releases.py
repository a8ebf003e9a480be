"""The Releases panel on a model's page (dashboard/views/releases.py): promote a version to an alias,
optionally for one GPU class, and roll it back, through the same service calls as `enginecache
release` (audited, shown in the state they produced); a viewer sees the aliases with the buttons
disabled, and the service refuses a viewer's move as well."""

from __future__ import annotations

import time

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.dashboard import app as dashboard_app
from enginecache.service.access import audit
from enginecache.service.access.roles import Role, set_role
from enginecache.service.models.register import register_model
from enginecache.service.models.releases import aliases, promote
from tests.dashboardkit import TIMEOUT, Seeded, frame, texts
from tests.modelfactory import make_mlp
from tests.test_dashboard_login import AUTH


def _model_page(model_id: int) -> AppTest:
    script = (
        "import streamlit as st\nfrom enginecache.dashboard.views import models\n"
        f"st.query_params['model'] = '{model_id}'\nmodels.render()\n"
    )
    return AppTest.from_string(script, default_timeout=TIMEOUT)


def _second_version(seeded: Seeded) -> int:
    path = make_mlp(seeded.app.home.parent / "v2.onnx", seed=7)
    return register_model(seeded.app, path, name=_name(seeded), new_version=True).model.id or 0


def _name(seeded: Seeded) -> str:
    from enginecache.service.models.register import get_model

    return get_model(seeded.app, seeded.model_id).name


def test_an_operator_promotes_and_rolls_back_from_the_model_page(seeded: Seeded) -> None:
    name = _name(seeded)
    newest = _second_version(seeded)
    at = _model_page(newest).run()
    assert not at.exception
    assert "version 2 of 2" in texts(at) and "No aliases yet" in texts(at)
    form_alias = next(t for t in at.text_input if t.label == "Alias")
    form_alias.set_value("prod")
    version = next(s for s in at.selectbox if s.label == "Version")
    version.set_value(1)
    next(b for b in at.button if b.label == "Promote").click()
    at.run()
    assert not at.exception and not at.error
    assert f"{name}@prod now points at version 1" in texts(at)
    [row] = frame(at, "alias", "for", "version").to_dict("records")
    assert (row["alias"], row["for"], row["version"], row["model id"]) == ("prod", "every host", 1, seeded.model_id)
    next(t for t in at.text_input if t.label == "Alias").set_value("prod")
    next(s for s in at.selectbox if s.label == "Version").set_value(2)
    next(t for t in at.text_input if t.label == "GPU class (optional)").set_value("")
    next(b for b in at.button if b.label == "Promote").click()
    at.run()
    assert [(a.alias, a.version) for a in aliases(seeded.app, name)] == [("prod", 2)]
    at.button(key="models_rollback_prod_").click()
    at.run()
    assert not at.exception and not at.error
    assert f"{name}@prod now points at version 1" in texts(at)
    assert [(a.alias, a.version) for a in aliases(seeded.app, name)] == [("prod", 1)]
    assert len(audit.list_audit(seeded.app, action=audit.RELEASE_PROMOTE)) == 2, "each move audited"
    assert len(audit.list_audit(seeded.app, action=audit.RELEASE_ROLLBACK)) == 1


def test_a_promote_for_one_gpu_class_and_a_bad_alias_are_shown_as_such(seeded: Seeded) -> None:
    name = _name(seeded)
    at = _model_page(seeded.model_id).run()
    next(t for t in at.text_input if t.label == "Alias").set_value("canary")
    next(t for t in at.text_input if t.label == "GPU class (optional)").set_value("sm86")
    next(b for b in at.button if b.label == "Promote").click()
    at.run()
    assert f"{name}@canary for sm86 now points at version 1" in texts(at)
    assert frame(at, "alias", "for").to_dict("records")[0]["for"] == "sm86"
    next(t for t in at.text_input if t.label == "Alias").set_value("9 bad")
    next(b for b in at.button if b.label == "Promote").click()
    at.run()
    assert at.error and "cannot promote 9 bad" in at.error[0].value
    assert [(a.alias, a.gpu_class) for a in aliases(seeded.app, name)] == [("canary", "sm86")], "nothing else moved"


def test_a_viewer_sees_the_aliases_with_the_buttons_disabled(seeded: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    name = _name(seeded)
    promote(seeded.app, name, "prod")
    set_role(seeded.app, "viewer@example.com", Role.VIEWER)
    views = dashboard_app.VIEWS
    monkeypatch.setattr(dashboard_app, "VIEWS", tuple(sorted(views, key=lambda v: v[0] != "models")))
    script = (
        "import streamlit as st\nfrom enginecache.dashboard import app\n"
        f"st.query_params['model'] = '{seeded.model_id}'\napp.main()\n"
    )
    at = AppTest.from_string(script, default_timeout=TIMEOUT)
    at.secrets["auth"] = AUTH
    at.user = {"is_logged_in": True, "email": "viewer@example.com", "email_verified": True, "exp": time.time() + 3600}
    try:
        at.run()
        assert not at.exception
        assert frame(at, "alias", "for").to_dict("records")[0]["alias"] == "prod"
        assert next(b for b in at.button if b.label == "Promote").disabled
        assert at.button(key="models_rollback_prod_").disabled
    finally:
        audit.use_actor_source(None)


def test_choosing_version_2_in_the_model_selector_promotes_version_2(seeded: Seeded) -> None:
    """Two versions of one name were two identical labels in the Model selector: choosing version 2
    showed version 1's page again, and Promote moved the alias to version 1. Each version is labelled
    `name vN`, and the promote acts on the version chosen."""
    name = _name(seeded)
    newest = _second_version(seeded)
    script = (  # opened on version 1's address once; the selector decides from then on
        "import streamlit as st\nfrom enginecache.dashboard.views import models\n"
        f"if 'model' not in st.query_params:\n    st.query_params['model'] = '{seeded.model_id}'\nmodels.render()\n"
    )
    at = AppTest.from_string(script, default_timeout=TIMEOUT).run()
    assert not at.exception and "version 1 of 2" in texts(at)
    selector = at.selectbox(key="models_detail")
    assert list(selector.options)[:2] == [f"{name} v2", f"{name} v1"], selector.options
    selector.set_value(newest).run()
    assert not at.exception and "version 2 of 2" in texts(at)
    next(t for t in at.text_input if t.label == "Alias").set_value("prod")
    next(b for b in at.button if b.label == "Promote").click()
    at.run()
    assert not at.exception and not at.error
    [alias] = aliases(seeded.app, name)
    assert (alias.alias, alias.version, alias.model_id) == ("prod", 2, newest)
    assert frame(at, "name", "version", "kind")["version"].tolist()[:2] == ["2", "1"], "the Models table names versions"
