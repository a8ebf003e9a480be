"""Who can reach the dashboard: the address `serve` listens on, decided by whether a login is set up.

Without a login (Streamlit's native OIDC `[auth]` section in its secrets.toml) anyone who reaches
the port can browse, build, retire and download engines, so `serve` listens on 127.0.0.1 only and
says so. Any other address needs a login, or an explicit `--insecure-no-auth`, which is warned
about every time (behind a reverse proxy that does its own authentication, for instance).

With a login configured and no address asked for, `serve` listens on its login address where one
is set (`--login-address`, ENGINECACHE_LOGIN_ADDRESS: the Docker image sets 0.0.0.0, so a container
with a login mounted is reachable through its published port) and on 127.0.0.1 otherwise.

Whether a login is configured is Streamlit's answer, not a reading of our own: a child process in
the dashboard's folder and environment resolves Streamlit's config and loads the secrets it names
(`streamlit_login_configured`). The running dashboard confirms it on every page: started to require
a login (`LOGIN_REQUIRED_ENV`), it shows nothing but a refusal while Streamlit offers no login.
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from enginecache.errors import ServeError

LOOPBACK = "127.0.0.1"


# Run by `streamlit_login_configured` in a child with the dashboard's working folder and environment:
# `streamlit run`'s own parsing of its flags and STREAMLIT_* variables (click), its own config
# resolution (~/.streamlit and ./.streamlit config.toml: `[secrets] files` among them) and its own
# loading of the secrets that names, in a process of its own (loading secrets puts their top-level
# values into the environment, which no other child may inherit).
_PROBE = """
import json, sys
from streamlit.web import bootstrap, cli
from streamlit import config
from streamlit.runtime.secrets import Secrets
from enginecache.service.access.exposure import has_login_provider
params = cli.main_run.make_context("run", sys.argv[1:]).params
bootstrap.load_config_options(flag_options={k: v for k, v in params.items() if k not in ("target", "args")})
secrets = Secrets()
auth = secrets.get("auth") if secrets.load_if_toml_exists() else None
print(json.dumps({"login": has_login_provider(auth), "files": list(config.get_option("secrets.files"))}))
"""
PROBE_SECONDS = 120


@dataclass(frozen=True)
class LoginProbe:
    configured: bool
    files: tuple[str, ...]  # where Streamlit reads secrets, in its order


def streamlit_login_configured(
    env: Mapping[str, str], cwd: Path | None = None, run_args: Sequence[str] = ("app.py",)
) -> LoginProbe:
    """Whether the dashboard, started with `env` in `cwd`, will offer a login: asked of Streamlit
    itself, so every place its config can name secrets from (`[secrets] files`, STREAMLIT_SECRETS_FILES)
    counts; `run_args` are what follows `streamlit run` (the script, then its flags). A secrets file
    Streamlit cannot load is no login. ServeError where the probe fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=dict(env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=PROBE_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise ServeError(f"could not ask Streamlit whether a login is configured: {err}") from err
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise ServeError(f"could not ask Streamlit whether a login is configured: {tail[0]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return LoginProbe(bool(answer["login"]), tuple(str(f) for f in answer["files"]))


def has_login_provider(auth: object) -> bool:
    """Whether an `[auth]` table names a provider Streamlit can log in with (`server_metadata_url`
    and `client_id`, directly or in a named provider's table): the one rule `serve` (deciding its
    address) and the dashboard (deciding to ask for a login) both follow."""
    if not isinstance(auth, Mapping):
        return False
    tables = [auth, *(v for v in auth.values() if isinstance(v, Mapping))]
    return any(t.get("server_metadata_url") and t.get("client_id") for t in tables)


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


# Set by `serve` in the dashboard's environment where it listens beyond loopback because a login is
# configured: the running app then refuses every page while Streamlit offers no login after all.
LOGIN_REQUIRED_ENV = "ENGINECACHE_LOGIN_REQUIRED"


@dataclass(frozen=True)
class Exposure:
    address: str
    note: str  # what `serve` prints about who can reach it
    login_required: bool = False  # the dashboard must refuse to serve without a login


def decide_exposure(
    requested: str | None, *, login: bool, insecure_no_auth: bool, login_address: str | None = None
) -> Exposure:
    """The address to listen on and what to say about it: `requested`, else `login_address` where a
    login is configured, else 127.0.0.1. ServeError where an address other than loopback is asked for
    with no login and no `--insecure-no-auth`; `login_address` never opens an address by itself."""
    if login:
        address = requested or login_address or LOOPBACK
        return Exposure(address, f"login required (Streamlit OIDC); listening on {address}", not is_loopback(address))
    address = requested or LOOPBACK
    if is_loopback(address):
        return Exposure(
            address,
            f"no login is configured: listening on {address} only (to serve others, configure [auth] in "
            "Streamlit's secrets.toml, or behind a proxy that authenticates pass --address 0.0.0.0 "
            "--insecure-no-auth: ENGINECACHE_ADDRESS and ENGINECACHE_INSECURE_NO_AUTH=1)",
        )
    if not insecure_no_auth:
        raise ServeError(
            f"refusing to listen on {address} without a login: anyone reaching it could build, retire and "
            "download engines; configure Streamlit's [auth] (OIDC) in .streamlit/secrets.toml, or pass "
            "--insecure-no-auth (behind a proxy that authenticates)"
        )
    return Exposure(
        address,
        f"WARNING: listening on {address} with NO LOGIN (--insecure-no-auth): anyone who reaches this "
        "port can build, retire and download engines",
    )
