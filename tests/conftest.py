"""Shared fixtures: temp homes, SQLite and PostgreSQL catalogs, the shared reference models."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from enginecache.service.context import AppContext

IN_CI = os.environ.get("CI") == "true"
SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
PG_ADMIN_URL = os.environ.get("ENGINECACHE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def skip_or_fail(reason: str) -> None:
    """Skip with the reason on a user's machine; under CI=true a missing prerequisite fails."""
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(reason)


def shared_model(name: str) -> Path:
    path = SHARED_MODELS / name
    if not path.is_file():
        skip_or_fail(f"{path} is absent (a user's clone has no ../shared/models)")
    return path


@pytest.fixture
def shared_models() -> Path:
    if not SHARED_MODELS.is_dir():
        skip_or_fail(f"{SHARED_MODELS} is absent (a user's clone has no ../shared/models)")
    return SHARED_MODELS


@pytest.fixture
def app_ctx(tmp_path: Path) -> Iterator[AppContext]:
    ctx = AppContext.from_settings(tmp_path / "home")
    yield ctx
    ctx.close()


def _pg_database() -> Iterator[str]:
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    name = f"enginecache_test_{uuid.uuid4().hex[:12]}"
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    except sa.exc.OperationalError as err:
        admin.dispose()
        skip_or_fail(f"PostgreSQL is unreachable at {PG_ADMIN_URL}: {err.orig}")
    url = sa.make_url(PG_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from _pg_database()


@pytest.fixture(params=["sqlite", "postgres"])
def catalog_ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AppContext]:
    """An app context on each catalog database in turn (same store layout)."""
    if request.param == "sqlite":
        ctx = AppContext.from_settings(tmp_path / "home")
        yield ctx
        ctx.close()
        return
    for url in _pg_database():
        ctx = AppContext.from_settings(tmp_path / "home", url)
        try:
            yield ctx
        finally:
            ctx.close()
