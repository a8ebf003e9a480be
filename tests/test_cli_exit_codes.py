"""Exit codes by kind of error (0 ok, 1 failed, 2 bad input, 3 unavailable), a catalog that cannot be
reached, and usage errors."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from enginecache.db import catalog as catalog_module
from enginecache.db.catalog import Catalog
from enginecache.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    BuildFailedError,
    CatalogUnavailableError,
    EngineCacheError,
    InvalidModelError,
    JobWaitError,
    NotFoundError,
    StoreError,
    exit_code_for,
)
from enginecache.service.context import AppContext
from tests.clirunner import run_cli
from tests.nocatalog import NOBODY


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (EngineCacheError("x"), EXIT_FAILED),
        (BuildFailedError("x"), EXIT_FAILED),
        (JobWaitError("x", job_id=1, waited_for="y"), EXIT_FAILED),
        (InvalidModelError("x"), EXIT_BAD_INPUT),
        (NotFoundError("x"), EXIT_BAD_INPUT),
        (CatalogUnavailableError("x"), EXIT_UNAVAILABLE),
        (StoreError("x"), EXIT_UNAVAILABLE),
        (ValueError("x"), EXIT_FAILED),
    ],
)
def test_exit_code_per_kind(error: BaseException, code: int) -> None:
    assert exit_code_for(error) == code


def test_catalog_outage_exits_3_naming_the_catalog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_cli(capsys, "--home", str(tmp_path / "home"), "--db", NOBODY, "model", "list")
    assert result.code == EXIT_UNAVAILABLE, (result.out, result.err)
    assert result.err.startswith(
        "error: cannot reach the catalog at postgresql+psycopg://postgres:***@127.0.0.1:1/nope"
    )
    assert "Connection refused" in result.err
    assert "hunter2" not in result.err and "Traceback" not in result.err
    assert result.out == ""


@pytest.mark.slow
def test_catalog_outage_exit_code_of_the_real_process(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "enginecache.cli", "--home", str(tmp_path / "home"), "--db", NOBODY, "model", "list"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.startswith("error: cannot reach the catalog at ") and "Traceback" not in done.stderr


def test_sqlite_catalog_that_cannot_be_opened_exits_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-dir' / 'catalog.db'}"
    result = run_cli(capsys, "--home", str(tmp_path / "home"), "--db", url, "jobs")
    assert result.code == EXIT_UNAVAILABLE, result.err
    assert "cannot reach the catalog at sqlite:///" in result.err and "unable to open database file" in result.err


@pytest.mark.parametrize("session", ["read", "write"])
def test_connect_failure_in_a_session_is_unavailable_and_still_an_operational_error(session: str) -> None:
    """The worker rides out an unreachable catalog by catching OperationalError: it still can."""
    catalog = Catalog(NOBODY, migrate=False)
    try:
        with pytest.raises(CatalogUnavailableError) as caught, getattr(catalog, session)():
            pytest.fail("the session connected")
    finally:
        catalog.dispose()
    assert isinstance(caught.value, sa.exc.OperationalError)
    assert caught.value.orig is not None
    assert exit_code_for(caught.value) == EXIT_UNAVAILABLE
    assert "127.0.0.1:1" in str(caught.value) and "hunter2" not in str(caught.value)


def test_sqlite_busy_is_not_unavailable(app_ctx: AppContext, monkeypatch: pytest.MonkeyPatch) -> None:
    """'database is locked' is contention the worker rides out, not an outage: it passes through as it is."""
    app_ctx.catalog  # noqa: B018 - create and migrate
    holder = sqlite3.connect(app_ctx.home / "catalog.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    monkeypatch.setattr(catalog_module, "SQLITE_BUSY_TIMEOUT_MS", 100)
    contender = Catalog(app_ctx.db_url, migrate=False)
    try:
        with pytest.raises(sa.exc.OperationalError, match="locked") as caught, contender.write():
            pytest.fail("the write lock was free")
        assert not isinstance(caught.value, CatalogUnavailableError)
        with contender.read() as session:  # readers are not blocked (WAL)
            session.exec(sa.text("SELECT 1"))  # type: ignore[call-overload]
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        contender.dispose()


def test_a_usage_error_exits_2_with_the_usage_and_no_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["engine", "show"], ["model", "list", "--bogus"], ["no-such-command"]):
        result = run_cli(capsys, *args)
        assert result.code == EXIT_BAD_INPUT, (args, result.err)
        assert "Usage:" in result.err and "Traceback" not in result.err
