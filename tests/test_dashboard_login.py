"""With a login configured (Streamlit's [auth]), the dashboard shows nothing but its login until the
user is logged in, and a session whose identity token has expired is logged out (Streamlit's cookie
cannot be revoked server-side, so the token's own maximum age ends it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.dashboard.app import session_expired
from enginecache.service.access import audit
from enginecache.service.access.roles import Role, set_role
from enginecache.service.context import AppContext
from tests.dashboardkit import serve_home

TIMEOUT = 60
AUTH = {
    "redirect_uri": "http://localhost:8501/oauth2callback",
    "cookie_secret": "a-test-secret",
    "client_id": "enginecache",
    "client_secret": "s3cret",
    "server_metadata_url": "http://127.0.0.1:9/.well-known/openid-configuration",
}

ISSUER = "http://127.0.0.1:9"
OPERATOR = {"is_logged_in": True, "iss": ISSUER, "sub": "u-17", "email": "op@example.com", "email_verified": True}


@pytest.fixture
def router(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppTest]:
    serve_home(tmp_path / "home", monkeypatch)
    app = AppContext.from_settings(tmp_path / "home")
    set_role(app, "op@example.com", Role.OPERATOR)  # as the local admin (the test's OS user)
    app.close()
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.secrets["auth"] = AUTH
    yield at
    audit.use_actor_source(None)


def _buttons(at: AppTest) -> list[str]:
    return [b.label for b in at.button]


def test_with_a_login_configured_a_visitor_sees_only_the_login(router: AppTest) -> None:
    router.user = {"is_logged_in": False}
    router.run()
    assert not router.exception
    assert _buttons(router) == ["Log in"]
    assert [t.value for t in router.title] == ["enginecache"], "no page of the dashboard ran"


def test_a_logged_in_user_with_a_live_token_gets_the_dashboard(router: AppTest) -> None:
    router.user = {**OPERATOR, "exp": time.time() + 3600}
    router.run()
    assert not router.exception
    assert "Log in" not in _buttons(router) and "Log out" in _buttons(router)
    assert any("op@example.com" in c.value.replace("\\", "") for c in router.sidebar.caption)
    assert [t.value for t in router.title] != ["enginecache"], "a page of the dashboard ran"


def test_an_expired_token_ends_the_session(router: AppTest) -> None:
    router.user = {**OPERATOR, "exp": time.time() - 1}
    router.run()
    assert _buttons(router) == ["Log in"]


def test_session_expiry_reads_the_tokens_exp_claim() -> None:
    assert session_expired({"exp": 100}, now=100.0) and not session_expired({"exp": 101}, now=100.0)
    assert not session_expired({}, now=100.0), "no exp claim: Streamlit's cookie lifetime applies"


def test_an_auth_section_without_a_provider_is_no_login_for_the_dashboard_as_for_serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve listens on loopback for it (service.access.exposure); the dashboard must not then ask for a
    login it cannot perform."""
    from enginecache.service.access.exposure import has_login_provider

    no_provider = {"redirect_uri": AUTH["redirect_uri"], "cookie_secret": AUTH["cookie_secret"]}
    assert not has_login_provider(no_provider) and has_login_provider(AUTH)
    serve_home(tmp_path / "home", monkeypatch)
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.secrets["auth"] = no_provider
    at.run()
    assert not at.exception and "Log in" not in _buttons(at)
    audit.use_actor_source(None)


def test_started_to_require_a_login_the_dashboard_shows_nothing_while_streamlit_offers_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """serve listens beyond loopback counting on a login (LOGIN_REQUIRED_ENV); if the running app's
    Streamlit has none after all, every page is a refusal, not the dashboard as the local admin."""
    from enginecache.service.access.exposure import LOGIN_REQUIRED_ENV

    serve_home(tmp_path / "home", monkeypatch)
    monkeypatch.setenv(LOGIN_REQUIRED_ENV, "1")
    at = AppTest.from_string("from enginecache.dashboard import app\napp.main()\n", default_timeout=TIMEOUT)
    at.run()
    assert not at.exception
    assert [e.value for e in at.error] and "require a login" in at.error[0].value
    assert not at.button and not at.tabs and not at.dataframe, "nothing of the dashboard is shown"
    audit.use_actor_source(None)


@pytest.mark.parametrize(
    ("claims", "says"),
    [
        ({"name": "op@example.com", "sub": "u-66"}, "u-66"),  # a display name is not an identity
        ({"email": "op@example.com", "email_verified": False, "sub": "u-66"}, "u-66"),
        ({"email": "op@example.com", "sub": "u-66"}, "u-66"),  # no email_verified claim: not verified
    ],
    ids=["name-only", "email-not-verified", "email-unverified-by-omission"],
)
def test_an_unverified_email_or_a_display_name_gets_no_role_granted_to_that_email(
    router: AppTest, claims: dict[str, object], says: str
) -> None:
    """op@example.com holds the operator role; a login whose token only claims that name or an
    unverified e-mail is its subject, which holds no role."""
    router.user = {"is_logged_in": True, "iss": ISSUER, "exp": time.time() + 3600, **claims}
    router.run()
    assert not router.exception
    shown = [e.value.replace("\\", "") for e in router.error]  # markdown-escaped
    assert any("has no role" in text and f"{ISSUER}#{says}" in text for text in shown), shown


def test_identity_is_a_verified_email_else_the_issuers_subject() -> None:
    from enginecache.service.access.roles import UNNAMED_LOGIN, login_identity, normalize_subject

    assert login_identity({"email": "Op@Example.com", "email_verified": True, "sub": "1"}) == "Op@Example.com"
    assert login_identity({"email": "op@example.com", "email_verified": "true", "iss": "https://idp", "sub": "Ab"}) == (
        "https://idp#Ab"
    ), "only a boolean true verifies"
    assert login_identity({"name": "admin", "sub": "Ab"}) == "Ab" and login_identity({"name": "x"}) == UNNAMED_LOGIN
    assert normalize_subject("Op@Example.com") == "op@example.com"
    assert normalize_subject("https://idp#Ab") == "https://idp#Ab", "a subject keeps its case"
