"""The login end to end against a real OpenID Connect provider: tests/oidc/provider.mjs
(`oidc-provider`, run by Node on 127.0.0.1, tests/oidckit.py) and `enginecache serve` with
Streamlit's `[auth]` pointing at it, driven in headless Debian Chromium through Playwright.

Serve reads the login from `.streamlit/secrets.toml` in its working folder, as Streamlit does
(and `serve` decides its exposure by the same file): the test runs it in a folder holding one.

Logged out, the dashboard shows only "Log in"; the button goes to the provider, which logs
admin@example.com in; back on the dashboard the sidebar says who is signed in. The roles steps
(viewer, operator, admin, no role, a role removed) run where `enginecache role` exists."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Browser, Page, expect, sync_playwright

from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from tests import oidckit
from tests.browserkit import generous_expect, launch, wait_for_app_run  # noqa: F401 - generous_expect: autouse
from tests.conftest import skip_or_fail
from tests.servekit import CHROMIUM, TIMEOUT_MS, free_port, serve_command, stop_serve, wait_for_dashboard

STOP_SECONDS = 60.0  # serve stopping its dashboard on SIGTERM (no worker here)
PASSWORD = "any-password"  # the provider's development login takes any password
NO_ROLE = "no role"  # what the page for a logged-in user without a role says (case-insensitive)


@dataclass(frozen=True)
class Site:
    url: str  # http://localhost:<port>, the origin of the redirect URI (Streamlit's cookies live there)
    home: Path
    provider: oidckit.OidcProvider
    import_root: Path  # ENGINECACHE_IMPORT_ROOTS: where "Path on the server" may register from


def _child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (HOME_ENV, DB_URL_ENV)}
    env.update(extra)
    return env


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "enginecache.cli", "--home", str(home), *args]
    return subprocess.run(command, env=_child_env(), capture_output=True, text=True, timeout=120)


@functools.cache
def roles_available() -> bool:
    """Whether this enginecache has the `role` command (roles are built beside this test)."""
    return _cli(Path("/nonexistent-enginecache-home"), "role", "--help").returncode == 0


def _set_role(site: Site, subject: str, role: str | None) -> None:
    args = ("role", "set", subject, role) if role else ("role", "remove", subject)
    done = _cli(site.home, *args)
    assert done.returncode == 0, done.stdout + done.stderr


def _secrets_toml(redirect_uri: str, provider: oidckit.OidcProvider) -> str:
    return (
        "[auth]\n"
        f'redirect_uri = "{redirect_uri}"\n'
        'cookie_secret = "enginecache-login-e2e-cookie-secret"\n'
        f'client_id = "{provider.client_id}"\n'
        f'client_secret = "{provider.client_secret}"\n'
        f'server_metadata_url = "{provider.metadata_url}"\n'
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """The provider, then `enginecache serve --no-worker` in a folder whose .streamlit/secrets.toml
    logs in through it (jobs the operator submits stay queued: nothing builds)."""
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is absent (apt-get install chromium); browser tests need it")
    root = tmp_path_factory.mktemp("login-e2e")
    home, cwd, import_root = root / "home", root / "site", root / "imports"
    import_root.mkdir()
    port = free_port()
    redirect_uri = f"http://localhost:{port}/oauth2callback"
    with oidckit.running_provider([redirect_uri]) as provider:
        (cwd / ".streamlit").mkdir(parents=True)
        (cwd / ".streamlit" / "secrets.toml").write_text(_secrets_toml(redirect_uri, provider))
        _seed_model(home)
        command = serve_command(home, port, "--no-worker")
        env = _child_env(ENGINECACHE_IMPORT_ROOTS=str(import_root))
        process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_for_dashboard(port, process)
            yield Site(f"http://localhost:{port}", home, provider, import_root)
        finally:
            log = stop_serve(process, STOP_SECONDS)
        assert process.returncode == 0, log[-3000:]
        assert "login required (Streamlit OIDC)" in log, log[-3000:]  # serve saw the [auth] section too


def _seed_model(home: Path) -> None:
    """One small model, so the Build page has something an operator can submit."""
    from enginecache.service.models.register import register_model
    from tests.modelfactory import make_mlp

    app = AppContext.from_settings(home)
    try:
        register_model(app, make_mlp(home.parent / "models" / "mlp.onnx"))
    finally:
        app.close()


@pytest.fixture(scope="module")
def browser(site: Site) -> Iterator[Browser]:
    with sync_playwright() as playwright:
        launched = launch(playwright)
        yield launched
        launched.close()


@pytest.fixture
def new_page(browser: Browser) -> Iterator[Page]:
    """A page in a fresh browser context: no cookies, so nobody is logged in yet."""
    context = browser.new_context(viewport={"width": 1440, "height": 1200})
    context.set_default_timeout(TIMEOUT_MS)
    page = context.new_page()
    yield page
    context.close()


def _log_in(page: Page, site: Site, email: str) -> None:
    """From the logged-out dashboard through the provider's login and consent, back signed in."""
    page.goto(f"{site.url}/")
    login = page.get_by_role("button", name="Log in")
    expect(login).to_be_visible()
    wait_for_app_run(page)
    # Logged out, the login is all there is: no pages, no sidebar.
    expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)
    expect(page.get_by_test_id("stSidebar")).to_have_count(0)
    expect(page.get_by_test_id("stMain").get_by_role("button")).to_have_count(1)
    login.click()
    page.wait_for_url(f"{site.provider.issuer}/interaction/**")
    page.locator("input[name=login]").fill(email)
    page.locator("input[name=password]").fill(PASSWORD)
    page.get_by_role("button", name="Sign-in").click()
    page.get_by_role("button", name="Continue").click()  # consent: openid email profile for `enginecache`
    page.wait_for_url(f"{site.url}/**")
    wait_for_app_run(page)
    # markdown_literal escapes the address in the caption's Markdown; the rendered text is plain.
    expect(page.get_by_test_id("stSidebar").get_by_test_id("stCaptionContainer").first).to_have_text(
        f"Signed in as {email}"
    )


def _goto(page: Page, site: Site, path: str) -> None:
    page.goto(f"{site.url}/{path}")
    wait_for_app_run(page)


@pytest.mark.slow
def test_login_through_a_real_oidc_provider(site: Site, new_page: Page) -> None:
    page = new_page
    if roles_available():
        _set_role(site, "admin@example.com", "admin")  # with roles, an account needs one to get past the gate
    _log_in(page, site, "admin@example.com")
    expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    expect(page.get_by_test_id("stSidebarNav").get_by_text("Build", exact=True)).to_be_visible()
    # The session survives a reload: Streamlit's identity cookie, not the page's state.
    page.reload()
    wait_for_app_run(page)
    expect(page.get_by_text("Signed in as admin@example.com", exact=True)).to_be_visible()
    expect(page.get_by_role("button", name="Log in")).to_have_count(0)
    # Logging out ends the provider's session too (RP-initiated logout), then the login is back.
    page.get_by_role("button", name="Log out").click()
    page.wait_for_url(f"{site.provider.issuer}/session/end**")
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_url(f"{site.url}/**")
    expect(page.get_by_role("button", name="Log in")).to_be_visible()
    expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)


def _roles_or_skip() -> None:
    if not roles_available():
        pytest.skip("`enginecache role` does not exist yet (roles are being built); the login alone is tested")


def _logged_in_as(page: Page, site: Site, email: str, role: str) -> Page:
    """`page` logged in as `email`, given `role` first."""
    _roles_or_skip()
    _set_role(site, email, role)
    _log_in(page, site, email)
    return page


@pytest.mark.slow
def test_account_without_a_role_sees_only_that(site: Site, new_page: Page) -> None:
    _roles_or_skip()
    page = new_page
    _log_in(page, site, "nobody@example.com")  # never given a role
    expect(page.get_by_text(NO_ROLE, exact=False).first).to_be_visible()
    expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)
    expect(page.get_by_role("heading", name="Overview")).to_have_count(0)


@pytest.mark.slow
def test_viewer_cannot_build_or_register_from_the_server(site: Site, new_page: Page) -> None:
    page = _logged_in_as(new_page, site, "viewer@example.com", "viewer")
    _goto(page, site, "build")
    expect(page.get_by_role("button", name="Submit 1 build(s)")).to_be_disabled()
    _goto(page, site, "models")
    expect(page.get_by_role("heading", name="Models", exact=True)).to_be_visible()
    expect(page.get_by_role("tab", name="Path on the server")).to_have_count(0)


@pytest.mark.slow
def test_operator_builds_until_the_role_is_removed(site: Site, new_page: Page) -> None:
    page = _logged_in_as(new_page, site, "operator@example.com", "operator")
    _goto(page, site, "build")
    submit = page.get_by_role("button", name="Submit 1 build(s)")
    expect(submit).to_be_enabled()
    submit.click()
    expect(page.get_by_text("queued job").first).to_be_visible()
    # Roles are read on every run: removed now, the next rerun shows the no-role page.
    _set_role(site, "operator@example.com", None)
    page.reload()
    wait_for_app_run(page)
    expect(page.get_by_text(NO_ROLE, exact=False).first).to_be_visible()
    expect(page.get_by_test_id("stSidebarNav")).to_have_count(0)


@pytest.mark.slow
def test_admin_sees_audit(site: Site, new_page: Page) -> None:
    page = _logged_in_as(new_page, site, "admin@example.com", "admin")
    expect(page.get_by_test_id("stSidebarNav").get_by_text("Audit", exact=True)).to_be_visible()
    _goto(page, site, "audit")
    expect(page.get_by_role("heading", name="Audit").first).to_be_visible()
    _goto(page, site, "models")
    expect(page.get_by_role("tab", name="Path on the server")).to_be_visible()
