"""Who can reach the dashboard: the address `serve` listens on, decided by whether a login is set up.

Without a login (Streamlit's native OIDC `[auth]` section in its secrets.toml) anyone who reaches
the port can browse, build, retire and download engines, so `serve` listens on 127.0.0.1 only and
says so. Any other address needs a login, or an explicit `--insecure-no-auth`, which is warned
about every time (behind a reverse proxy that does its own authentication, for instance).
"""

from __future__ import annotations

import ipaddress
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from enginecache.errors import ServeError

LOOPBACK = "127.0.0.1"


def streamlit_secrets_files(cwd: Path | None = None) -> tuple[Path, ...]:
    """Where Streamlit reads secrets.toml: the working folder's `.streamlit/`, then the user's."""
    return ((cwd or Path.cwd()) / ".streamlit" / "secrets.toml", Path.home() / ".streamlit" / "secrets.toml")


def login_configured(secrets_files: Iterable[Path]) -> bool:
    """Whether a secrets.toml has an `[auth]` section with a provider Streamlit can log in with
    (`server_metadata_url` and `client_id`, directly or in a named provider's table)."""
    for path in secrets_files:
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            continue
        except (OSError, tomllib.TOMLDecodeError) as err:
            raise ServeError(f"cannot read {path}: {err}") from err
        auth = data.get("auth")
        if has_login_provider(auth):
            return True
    return False


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


@dataclass(frozen=True)
class Exposure:
    address: str
    note: str  # what `serve` prints about who can reach it


def decide_exposure(requested: str | None, *, login: bool, insecure_no_auth: bool) -> Exposure:
    """The address to listen on and what to say about it; ServeError where an address other than
    loopback is asked for with no login and no `--insecure-no-auth`."""
    address = requested or LOOPBACK
    if login:
        return Exposure(address, f"login required (Streamlit OIDC); listening on {address}")
    if is_loopback(address):
        return Exposure(
            address, f"no login is configured: listening on {address} only (configure [auth] to serve others)"
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
