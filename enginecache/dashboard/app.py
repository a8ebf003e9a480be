"""The enginecache dashboard: `streamlit run enginecache/dashboard/app.py` (or `enginecache serve`).

An `st.navigation` router over one module per view. Views read the catalog through the service
layer and enqueue jobs; no engine is built or loaded in this process.

Each script run acts as its Streamlit user (`session_actor`, set with `service.access.audit.acting_as` around
the page), so the audit log records who changed what from here. A fragment's own reruns (the Build
view's job cards) run without this script, in a thread of their own: `service.access.audit.use_actor_source`
names the same user to them.

Each run reads the user's role again (`service.access.roles`, after the login): a logged-in user with no
role sees only a line saying so; the others get the views their role may see (Audit: admins), and
views hide the actions the role may not take (`data.current_role`). The service layer checks again.

A view's module (and the dashboard's data layer) is imported when a view first runs, not when the
router does: the first page a new server process renders (Overview) then imports what it uses
(pandas, plotly's graph objects, the catalog and its read models) and not what Build and Engines
need (build planning, precision recipes, ONNX inspection, plotly express), which a server process
pays only if those views are opened.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from urllib.parse import urlsplit

# `streamlit run .../enginecache/dashboard/app.py` puts the dashboard folder (not the one holding the
# `enginecache` package) on sys.path.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from enginecache.service.access.audit import Actor, acting_as, use_actor_source  # noqa: E402
from enginecache.service.access.exposure import LOGIN_REQUIRED_ENV, has_login_provider  # noqa: E402
from enginecache.service.access.roles import Role, login_identity  # noqa: E402
from enginecache.service.readmodels.display import markdown_literal  # noqa: E402

logger = logging.getLogger(__name__)

VIEWS_PACKAGE = "enginecache.dashboard.views"

# (view module under enginecache.dashboard.views, title, url path, icon); the first is the default page.
VIEWS: tuple[tuple[str, str, str, str], ...] = (
    ("overview", "Overview", "overview", ":material/dashboard:"),
    ("models", "Models", "models", ":material/deployed_code:"),
    ("build", "Build", "build", ":material/construction:"),
    ("coverage", "Coverage", "coverage", ":material/grid_view:"),
    ("engines", "Engines", "engines", ":material/memory:"),
    ("timings", "Timings", "timings", ":material/timer:"),
    ("hosts", "Hosts", "hosts", ":material/dns:"),
    ("audit", "Audit", "audit", ":material/history:"),
)
NO_LOGIN = "dashboard (no login)"
# The least role a view needs to be listed in the navigation (every other view: viewer).
VIEW_ROLES: dict[str, Role] = {"audit": Role.ADMIN}
ROLE_STATE = "enginecache_role"  # st.session_state: this run's role (`data.current_role`), set by main()
NO_ROLE = "your account {who} has no role on this dashboard; ask an admin"


def session_actor() -> Actor:
    """Who this session acts as: the logged-in user (`service.access.roles.login_identity`: a
    verified e-mail, else the issuer's subject; not local: their role is their row in `user_roles`),
    else `dashboard (no login)` (local: without a login the dashboard listens on 127.0.0.1 only, and
    acts as the local admin); from `dashboard` and the client's address where Streamlit knows it
    (none for a client on localhost)."""
    address = st.context.ip_address
    origin = f"dashboard {address}" if isinstance(address, str) and address else "dashboard"
    if st.user.get("is_logged_in") is not True:
        return Actor(NO_LOGIN, origin, local=True)
    return Actor(login_identity(st.user.to_dict()), origin, local=False)


def script_run_actor() -> Actor | None:
    """The audit's actor source (`use_actor_source`): the session's user inside a Streamlit script
    run, a fragment's own rerun included; nobody in any other thread."""
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    if get_script_run_ctx(suppress_warning=True) is None:
        return None
    return session_actor()


def view_render(module: str, title: str = "") -> Callable[[], None]:
    """The view's `render`, its module imported on the first call, under a spinner ("Loading
    Build…", shown once the view has taken Streamlit's spinner delay, half a second) until the
    view has drawn: the first render of a view imports its module and reads the catalog, seconds
    on a cold server, which was a blank page."""

    def render() -> None:
        with st.spinner(f"Loading {title or module}…"):
            importlib.import_module(f"{VIEWS_PACKAGE}.{module}").render()

    render.__module__ = f"{VIEWS_PACKAGE}.{module}"
    return render


def guarded(render: Callable[[], None]) -> Callable[[], None]:
    """Run a view; an unexpected error is shown with its reason, never as a traceback."""

    def run() -> None:
        try:
            render()
        except Exception as err:  # noqa: BLE001 - shown to the operator with its reason
            from enginecache.dashboard.data import show_error

            show_error(err, "this view failed")

    run.__name__ = render.__module__.rsplit(".", 1)[-1]
    return run


def login_configured() -> bool:
    """Whether Streamlit has a login to offer: an `[auth]` section in its secrets (the same rule
    `serve` used to decide it may listen beyond 127.0.0.1)."""
    from streamlit.errors import StreamlitSecretNotFoundError

    try:
        auth = st.secrets.get("auth")
    except StreamlitSecretNotFoundError:  # no secrets.toml at all: no login configured
        return False
    return has_login_provider(auth)


def session_expired(claims: Mapping[str, object], now: float) -> bool:
    """Whether the identity token's own expiry (`exp`, seconds since the epoch) has passed: the
    cookie Streamlit keeps cannot be revoked server-side, so the token's maximum age ends the session."""
    expiry = claims.get("exp")
    return isinstance(expiry, int | float) and expiry <= now


def gate_login() -> bool:
    """Where a login is configured: True for a logged-in user whose token has not expired; else
    shows the login button (and logs an expired session out) and returns False."""
    if not login_configured():
        if os.environ.get(LOGIN_REQUIRED_ENV) == "1":  # serve listens beyond loopback counting on a login
            st.title("enginecache")
            st.error(
                "This dashboard was started to require a login, but Streamlit offers none (no [auth] provider "
                "in the secrets it loads): nothing is shown. Fix the secrets, or restart serve on 127.0.0.1."
            )
            return False
        return True
    if st.user.get("is_logged_in") is True and not session_expired(st.user.to_dict(), time.time()):
        st.sidebar.caption(f"Signed in as {markdown_literal(login_identity(st.user.to_dict()))}")
        st.sidebar.button("Log out", on_click=st.logout, key="logout")
        return True
    if st.user.get("is_logged_in") is True:
        st.logout()  # the token's maximum age has passed
    st.title("enginecache")
    st.write("Log in to use this dashboard.")
    st.button("Log in", on_click=st.login, key="login", type="primary")
    return False


def session_role(actor: Actor) -> Role | None:
    """The actor's role, read again on every run (`service.access.roles.role_of`): a local actor (no login
    configured) is the local admin without a catalog read; a logged-in user's comes from the catalog."""
    from enginecache.service.access.roles import role_of

    if actor.local:
        return Role.ADMIN
    from enginecache.dashboard.data import get_app

    return role_of(get_app(), actor)


HOME_PATH = "home"  # the default page's reserved url path: it is served at the root, "/"
PAGE_TITLE = "enginecache"


def view_pages(shown: list[tuple[str, str, str, str]]) -> tuple[st.Page, list[st.Page]]:
    """The root page and one page per view, each at its own url path: Streamlit serves the default
    page at "/" only (its `url_path` is ""), so the first view is also registered as a page of its
    own, and `/overview` opens it. The root page draws the same view and is left out of the
    navigation (`visibility="hidden"`), which lists each view once."""
    pages = [
        st.Page(guarded(view_render(module, title)), title=title, url_path=path, icon=icon)
        for module, title, path, icon in shown
    ]
    module, title, _, icon = shown[0]
    home = st.Page(
        guarded(view_render(module, title)),
        title=title,
        url_path=HOME_PATH,
        icon=icon,
        default=True,
        visibility="hidden",
    )
    return home, pages


def unknown_path(url: str | None, known: Sequence[str], base_url_path: str | None) -> str | None:
    """The path the browser asked for where no view has it (`url`: `st.context.url`, under the
    server's `baseUrlPath`); None for the root, a view's path, or no URL known."""
    if not url:
        return None
    path = urlsplit(url).path.strip("/")
    base = (base_url_path or "").strip("/")
    if base and (path == base or path.startswith(base + "/")):
        path = path[len(base) :].strip("/")
    return None if not path or path in known or path == HOME_PATH else path


def main() -> None:
    from enginecache.dashboard.branding import page_icon

    # before anything is drawn: the title and a favicon served by this server (no CDN)
    st.set_page_config(page_title=PAGE_TITLE, page_icon=page_icon(), layout="wide")
    if not gate_login():
        return
    use_actor_source(script_run_actor)
    actor = session_actor()
    role = session_role(actor)
    st.session_state[ROLE_STATE] = role.value if role is not None else None
    if role is None:  # deny by default: a logged-in user nobody gave a role sees nothing of the catalog
        st.title("enginecache")
        st.error(NO_ROLE.format(who=markdown_literal(actor.name)), icon=":material/block:")
        return
    # Streamlit's first element in a process walks the stack and maps every loaded module to its
    # file (its REPL check): emitted before a view imports pandas and SQLAlchemy, that is cheap.
    st.sidebar.caption("enginecache: build TensorRT engines once, load them in milliseconds.")
    shown = [view for view in VIEWS if role >= VIEW_ROLES.get(view[0], Role.VIEWER)]
    home, pages = view_pages(shown)
    with acting_as(actor):
        page = st.navigation([home, *pages])
        if page is home:  # Streamlit draws the default page for an address it has no page for
            missing = unknown_path(st.context.url, [p.url_path for p in pages], st.get_option("server.baseUrlPath"))
            if missing is not None:
                st.warning(
                    markdown_literal(f"There is no page at /{missing}: this is the {shown[0][1]}."),
                    icon=":material/link_off:",
                )
        page.run()


if __name__ == "__main__":
    main()
