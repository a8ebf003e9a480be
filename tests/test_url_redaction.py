"""No catalog secret in what enginecache prints or records: the URL's password and every query
parameter that carries one (`?password=`, `sslpassword`) are hidden wherever the URL is shown."""

from __future__ import annotations

import subprocess
import sys

import pytest

from enginecache.db.catalog import safe_url
from tests.s3kit import free_port

SECRET = "hunter2-not-for-logs"


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://enginecache:{SECRET}@127.0.0.1:5432/catalog",
        f"postgresql://enginecache@127.0.0.1:5432/catalog?password={SECRET}&connect_timeout=3",
        f"postgresql+psycopg://enginecache@127.0.0.1/catalog?sslmode=require&sslpassword={SECRET}",
        f"postgresql://enginecache@127.0.0.1/catalog?PASSWORD={SECRET}",
    ],
)
def test_safe_url_hides_every_secret_and_keeps_the_rest(url: str) -> None:
    shown = safe_url(url)
    assert SECRET not in shown and "***" in shown
    assert "127.0.0.1" in shown and "catalog" in shown and "enginecache" in shown


def test_a_catalog_that_cannot_be_reached_is_reported_without_its_password() -> None:
    """The finding: `--db 'postgresql://...?password=...'` printed the password in the error."""
    url = f"postgresql://enginecache@127.0.0.1:{free_port()}/catalog?password={SECRET}&connect_timeout=2"
    done = subprocess.run(
        [sys.executable, "-m", "enginecache.cli", "--db", url, "jobs", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    assert "cannot reach the catalog" in done.stderr
    assert SECRET not in done.stdout + done.stderr
