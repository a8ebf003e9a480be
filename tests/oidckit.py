"""A real OpenID Connect provider for the login tests: tests/oidc/provider.mjs (panva's certified
`oidc-provider`, `make test` installs it with `npm ci --prefix tests/oidc`) run by Node on
127.0.0.1, on a port the kernel picks (no race for it), killed after the test.

Without node on PATH or tests/oidc/node_modules the test is skipped with the reason, and fails
under CI=true (where `make test` installs both)."""

from __future__ import annotations

import contextlib
import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import skip_or_fail

OIDC_DIR = Path(__file__).resolve().parent / "oidc"
PROVIDER = OIDC_DIR / "provider.mjs"
INSTALLED = OIDC_DIR / "node_modules" / "oidc-provider"
CLIENT_ID = "enginecache"
CLIENT_SECRET = "enginecache-test-secret"
# Accounts provider.mjs knows (any password logs in); each ID token carries `email` and `name`.
ACCOUNTS = ("viewer@example.com", "operator@example.com", "admin@example.com", "nobody@example.com")
READY_SECONDS = 60.0  # node starting and the provider listening (well under a second when idle)
STOP_SECONDS = 10.0


@dataclass(frozen=True)
class OidcProvider:
    issuer: str  # http://127.0.0.1:<port>
    client_id: str
    client_secret: str
    redirect_uris: tuple[str, ...]

    @property
    def metadata_url(self) -> str:
        return f"{self.issuer}/.well-known/openid-configuration"


def node_or_skip() -> str:
    node = shutil.which("node")
    if node is None:
        skip_or_fail("node is not on PATH; the OIDC login tests run tests/oidc/provider.mjs with Node.js")
    if not INSTALLED.is_dir():
        skip_or_fail(f"{INSTALLED} is absent; run `npm ci --prefix tests/oidc` (`make test` does)")
    assert node is not None
    return node


def _read_ready(process: subprocess.Popen[bytes], timeout: float) -> str:
    """The issuer from the provider's `READY <issuer>` line; AssertionError if it exits or times out."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffered = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), 4096)
            if not chunk:
                raise AssertionError(f"the OIDC provider exited with {process.wait()} before READY")
            buffered += chunk
            for line in buffered.decode(errors="replace").splitlines():
                if line.startswith("READY "):
                    return line.split(" ", 1)[1].strip()
    raise AssertionError(f"the OIDC provider printed no READY line within {timeout:.0f} s")


@contextlib.contextmanager
def running_provider(redirect_uris: Sequence[str]) -> Iterator[OidcProvider]:
    """Start provider.mjs with one client (`enginecache`) redirecting to `redirect_uris`, wait for
    READY, yield it; SIGTERM (then SIGKILL) after. Its log is in the AssertionError if it fails."""
    node = node_or_skip()
    command = [node, str(PROVIDER), "--port", "0", "--client-id", CLIENT_ID, "--client-secret", CLIENT_SECRET]
    for uri in redirect_uris:
        command += ["--redirect-uri", uri]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=OIDC_DIR, stdout=subprocess.PIPE, stderr=log)
        try:
            try:
                issuer = _read_ready(process, READY_SECONDS)
            except AssertionError as err:
                log.seek(0)
                raise AssertionError(f"{err}; its log:\n{log.read().decode(errors='replace')[-3000:]}") from None
            yield OidcProvider(issuer, CLIENT_ID, CLIENT_SECRET, tuple(redirect_uris))
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_SECONDS)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            if process.stdout is not None:
                process.stdout.close()
