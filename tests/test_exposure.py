"""Who can reach the dashboard: 127.0.0.1 without a login, another address only with one or with an
explicit --insecure-no-auth (warned about)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from enginecache.errors import EXIT_BAD_INPUT, ServeError, exit_code_for
from enginecache.service.access.exposure import (
    LOOPBACK,
    LoginProbe,
    decide_exposure,
    is_loopback,
    streamlit_login_configured,
)


def test_without_a_login_serve_listens_on_loopback_and_says_so() -> None:
    exposure = decide_exposure(None, login=False, insecure_no_auth=False)
    assert exposure.address == LOOPBACK and "no login is configured" in exposure.note
    assert decide_exposure("::1", login=False, insecure_no_auth=False).address == "::1"


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "10.1.2.3", "dashboard.example"])
def test_another_address_without_a_login_is_refused_unless_insecure_is_explicit(address: str) -> None:
    with pytest.raises(ServeError, match=f"refusing to listen on {address} without a login") as refused:
        decide_exposure(address, login=False, insecure_no_auth=False)
    assert exit_code_for(refused.value) == EXIT_BAD_INPUT
    warned = decide_exposure(address, login=False, insecure_no_auth=True)
    assert warned.address == address and warned.note.startswith("WARNING") and "NO LOGIN" in warned.note


def test_with_a_login_and_no_address_serve_listens_on_its_login_address() -> None:
    """The Docker image sets ENGINECACHE_LOGIN_ADDRESS=0.0.0.0: a container with a login mounted is
    reachable through its published port, and its dashboard must enforce the login."""
    exposure = decide_exposure(None, login=True, insecure_no_auth=False, login_address="0.0.0.0")
    assert exposure.address == "0.0.0.0" and exposure.login_required
    asked = decide_exposure("127.0.0.1", login=True, insecure_no_auth=False, login_address="0.0.0.0")
    assert asked.address == "127.0.0.1", "an address asked for wins"
    assert decide_exposure(None, login=True, insecure_no_auth=False).address == LOOPBACK


def test_without_a_login_the_login_address_opens_nothing_and_the_note_says_how() -> None:
    exposure = decide_exposure(None, login=False, insecure_no_auth=False, login_address="0.0.0.0")
    assert exposure.address == LOOPBACK and not exposure.login_required
    assert "ENGINECACHE_ADDRESS" in exposure.note and "--insecure-no-auth" in exposure.note
    with pytest.raises(ServeError, match=r"refusing to listen on 0\.0\.0\.0 without a login"):
        decide_exposure("0.0.0.0", login=False, insecure_no_auth=False, login_address="0.0.0.0")


def test_with_a_login_any_address_is_allowed_and_the_dashboard_must_enforce_it() -> None:
    exposure = decide_exposure("0.0.0.0", login=True, insecure_no_auth=False)
    assert exposure.address == "0.0.0.0" and exposure.login_required
    assert not decide_exposure("127.0.0.1", login=True, insecure_no_auth=False).login_required


AUTH = (
    '[auth]\nredirect_uri = "http://x/oauth2callback"\ncookie_secret = "s"\n'
    'client_id = "c"\nclient_secret = "p"\nserver_metadata_url = "http://idp/.well-known/openid-configuration"\n'
)


def _probe(folder: Path, monkeypatch: pytest.MonkeyPatch, **env: str) -> LoginProbe:
    """Streamlit's answer for a dashboard started in `folder` by a user whose home is `folder` too."""
    monkeypatch.setenv("HOME", str(folder))
    for name in [n for n in os.environ if n.startswith("STREAMLIT_")]:
        monkeypatch.delenv(name)
    return streamlit_login_configured({**os.environ, **env}, cwd=folder)


def test_a_login_is_an_auth_section_with_a_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / ".streamlit" / "secrets.toml"
    secrets.parent.mkdir()
    assert not _probe(tmp_path, monkeypatch).configured, "no file: no login"
    secrets.write_text('[auth]\nredirect_uri = "http://x/oauth2callback"\ncookie_secret = "s"\n')
    assert not _probe(tmp_path, monkeypatch).configured, "no provider"
    secrets.write_text(AUTH)
    probe = _probe(tmp_path, monkeypatch)
    assert probe.configured and str(secrets) in probe.files
    secrets.write_text(
        '[auth]\ncookie_secret = "s"\n[auth.corp]\nclient_id = "c"\nserver_metadata_url = "http://idp/"\n'
    )
    assert _probe(tmp_path, monkeypatch).configured, "a named provider counts too"
    secrets.write_text("[auth\n")
    assert not _probe(tmp_path, monkeypatch).configured, "secrets Streamlit cannot load are no login"


def test_the_secrets_streamlit_loads_decide_not_the_default_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full [auth] in ./.streamlit/secrets.toml while the config names other secrets files: Streamlit
    loads only those, so the dashboard has no login (serve said "login required" and listened on
    0.0.0.0 with every visitor the local admin)."""
    streamlit_dir = tmp_path / ".streamlit"
    streamlit_dir.mkdir()
    (streamlit_dir / "secrets.toml").write_text(AUTH)
    (tmp_path / "empty.toml").write_text("")
    (streamlit_dir / "config.toml").write_text(f'[secrets]\nfiles = ["{tmp_path / "empty.toml"}"]\n')
    probe = _probe(tmp_path, monkeypatch)
    assert not probe.configured and probe.files == (str(tmp_path / "empty.toml"),)
    with pytest.raises(ServeError, match=r"refusing to listen on 0\.0\.0\.0 without a login"):
        decide_exposure("0.0.0.0", login=probe.configured, insecure_no_auth=False)
    (streamlit_dir / "config.toml").unlink()
    elsewhere = tmp_path / "mounted" / "secrets.toml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(AUTH)
    (streamlit_dir / "secrets.toml").write_text("")
    assert _probe(tmp_path, monkeypatch, STREAMLIT_SECRETS_FILES=str(elsewhere)).configured, "named by the environment"


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("example.org", False),
    ],
)
def test_is_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


def test_serve_on_another_address_without_a_login_exits_2_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.clirunner import run_cli

    monkeypatch.chdir(tmp_path)  # no .streamlit/secrets.toml here
    monkeypatch.setenv("HOME", str(tmp_path))
    home = tmp_path / "home"
    refused = run_cli(capsys, "--home", str(home), "serve", "--address", "0.0.0.0", "--port", "1")
    assert refused.code == EXIT_BAD_INPUT
    assert "refusing to listen on 0.0.0.0 without a login" in refused.err and "--insecure-no-auth" in refused.err
    assert not home.exists(), "nothing was started or written"


@pytest.mark.timeout(120)
def test_serve_reads_its_address_from_the_environment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENGINECACHE_ADDRESS is `--address` (what a container's operator sets with `-e`): with no login
    it is refused before anything starts, as the flag is."""
    from tests.clirunner import run_cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ENGINECACHE_ADDRESS", "0.0.0.0")
    home = tmp_path / "home"
    refused = run_cli(capsys, "--home", str(home), "serve", "--port", "1")
    assert refused.code == EXIT_BAD_INPUT
    assert "refusing to listen on 0.0.0.0 without a login" in refused.err
    assert not home.exists(), "nothing was started or written"


def test_the_docker_image_opens_its_port_only_with_a_login_or_when_told() -> None:
    """The image's default: 0.0.0.0 where a login is configured (ENGINECACHE_LOGIN_ADDRESS), else
    loopback; nothing in it opens the port with no login (tests/test_image.py runs it)."""
    dockerfile = (Path(__file__).resolve().parents[1] / "Dockerfile").read_text()
    (command,) = [line for line in dockerfile.splitlines() if line.startswith("CMD ")]
    assert '"serve"' in command and "0.0.0.0" not in command and "--insecure-no-auth" not in command
    instructions = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    assert any("ENGINECACHE_LOGIN_ADDRESS=0.0.0.0" in line for line in instructions)
    assert not any("ENGINECACHE_ADDRESS=" in line or "ENGINECACHE_INSECURE_NO_AUTH" in line for line in instructions)
