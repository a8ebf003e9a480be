"""Shared fixtures: temp homes and app contexts, SQLite and PostgreSQL catalogs, the shared reference
models, a controlled clock for the queue, blob corruption, and skips for hosts a test does not fit.

Markers: tests on PostgreSQL carry `postgres` (the `catalog_ctx` fixture's postgres case, and
every test that uses `pg_url`), tests on ../shared/models or the corpus carry `shared` (marked in
their files, and every test that uses `shared_models`), and tests that took 1.5 s or more on the
2-core machine carry `slow` (most drive whole processes: a browser, the OIDC provider, workers
signalled or killed, crash injection, many builds; the fast lane names any test of its own that
takes that long, in its summary). `make test-fast` runs
`pytest -m "not postgres and not shared and not slow"`: about 80 s there, against about 290 s
for `-m "not postgres and not shared"`, which the slow tests alone take past 200 s.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import stat
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy as sa

from enginecache.db.models import utcnow
from enginecache.db.reader import sqlite_url
from enginecache.service.context import AppContext

if TYPE_CHECKING:
    from tests.dashboardkit import Seeded, SeedIds

IN_CI = os.environ.get("CI") == "true"
SHARED_MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
PG_ADMIN_URL = os.environ.get("ENGINECACHE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
FIXTURE_MARKS = {"pg_url": "postgres", "shared_models": "shared"}  # a test using the fixture gets the mark


# A test that takes this long (setup, call and teardown) belongs to `slow`: the fast lane's budget.
SLOW_SECONDS = 1.5
LANE_MARKS = ("slow", "postgres", "shared")  # a test with any of these is not in the fast lane
_lane_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not any(mark in report.keywords for mark in LANE_MARKS):
        _lane_seconds[report.nodeid] = _lane_seconds.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """In the fast lane (`-m` leaving `slow` out), name the tests that took SLOW_SECONDS or more, so
    the lane stays fast: a note, not a failure (a test's time depends on the machine and its load)."""
    if "not slow" not in (config.getoption("markexpr") or ""):
        return
    over = sorted(((s, n) for n, s in _lane_seconds.items() if s >= SLOW_SECONDS), reverse=True)
    if over:
        title = f"fast-lane tests that took {SLOW_SECONDS:g} s or more: mark them slow, or speed them up"
        terminalreporter.section(title)
        for seconds, nodeid in over:
            terminalreporter.write_line(f"{seconds:6.2f} s  {nodeid}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for fixture, mark in FIXTURE_MARKS.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(mark)


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


# The four reference models of ../shared/models, by the name `reference_catalog` registers each under.
REFERENCE_MODELS = {
    "resnet18": "resnet18.onnx",
    "mobilenet_v3_small": "mobilenet_v3_small.onnx",
    "bert_mini": "bert_mini.onnx",
    "tiny_llama": "tiny_llama.onnx",
}


def reference_catalog(folder: Path) -> Iterator[AppContext]:
    """An app context on folder/"home" with the reference models registered, closed at the end: for
    a module's fixture, `yield from reference_catalog(tmp_path_factory.mktemp(...))`."""
    from enginecache.service.models.register import register_model

    ctx = AppContext.from_settings(folder / "home")
    try:
        for name, filename in REFERENCE_MODELS.items():
            register_model(ctx, shared_model(filename), name=name)
        yield ctx
    finally:
        ctx.close()


# -- hosts ------------------------------------------------------------------------------------


@functools.cache
def host_gpu_names() -> tuple[str, ...]:
    """This host's NVIDIA GPUs (by NVML, as the product sees them), once per test session."""
    from enginecache.core.fingerprint import host_fingerprint

    return tuple(f"{g.name} ({g.compute_capability})" for g in host_fingerprint().gpus)


@pytest.fixture
def requires_no_gpu() -> None:
    """For tests whose expectations hold on a host without an NVIDIA GPU (verdicts such as
    "incompatible: this host has no NVIDIA GPU"): skipped, with the reason, on a host with one.
    Use as `@pytest.mark.usefixtures("requires_no_gpu")`."""
    gpus = host_gpu_names()
    if gpus:
        pytest.skip(f"expects a host without an NVIDIA GPU; this one has {', '.join(gpus)}")


@pytest.fixture(scope="session")
def installed_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An interpreter that starts as a regular install does (tests.installedpython): the editable
    install's finder imports pathlib, re, urllib.parse ... at every start, which would hide whether
    the code under test imports them."""
    from tests.installedpython import installed_python as make_installed_python

    return make_installed_python(
        tmp_path_factory.mktemp("installed") / "venv", Path(__file__).resolve().parents[1] / "enginecache"
    )


# -- homes and app contexts -------------------------------------------------------------------


@pytest.fixture(scope="session")
def migrated_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty SQLite catalog at the newest schema, migrated once per test process: a test's new
    home starts from a copy of it (what migrating an empty database gives, in milliseconds instead of
    Alembic's run). Migrating itself is tested in test_catalog_open.py, on databases of its own."""
    home = tmp_path_factory.mktemp("migrated-catalog")
    ctx = AppContext.from_settings(home)
    try:
        ctx.catalog  # creates and migrates it  # noqa: B018
    finally:
        ctx.close()  # SQLite checkpoints its WAL: catalog.db alone is the whole database
    left = sorted(p.name for p in home.iterdir())
    assert left == ["catalog.db"], left
    return home / "catalog.db"


def _start_from_migrated(ctx: AppContext, template: Path) -> None:
    """Give a new home its SQLite catalog as a copy of the migrated template (nothing where the
    context's catalog is elsewhere, or already there)."""
    database = ctx.home / "catalog.db"
    if ctx.db_url != sqlite_url(database) or ctx.home.exists():
        return
    ctx.home.mkdir(parents=True)
    shutil.copyfile(template, database)


@pytest.fixture
def app_factory(tmp_path: Path, migrated_catalog: Path) -> Iterator[Callable[..., AppContext]]:
    """Opens app contexts (`open(home=None, db_url=None)`; home defaults to tmp_path/"home") and
    closes every one of them after the test. The default home's SQLite catalog starts as a copy of
    `migrated_catalog`."""
    opened: list[AppContext] = []

    def open_app(home: Path | None = None, db_url: str | None = None) -> AppContext:
        ctx = AppContext.from_settings(home or tmp_path / "home", db_url)
        if home is None:
            _start_from_migrated(ctx, migrated_catalog)
        opened.append(ctx)
        return ctx

    yield open_app
    for ctx in opened:
        ctx.close()


@pytest.fixture
def app_ctx(app_factory: Callable[..., AppContext]) -> AppContext:
    """An app context on tmp_path/"home" with its SQLite catalog."""
    return app_factory()


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
    """A fresh PostgreSQL database's URL (dropped after the test); the test is marked `postgres`."""
    yield from _pg_database()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def catalog_ctx(request: pytest.FixtureRequest, app_factory: Callable[..., AppContext]) -> Iterator[AppContext]:
    """An app context on each catalog database in turn (same store layout)."""
    if request.param == "sqlite":
        yield app_factory()
        return
    for url in _pg_database():
        ctx = app_factory(db_url=url)
        try:
            yield ctx
        finally:
            ctx.close()  # before the database is dropped


# -- the queue's clock ------------------------------------------------------------------------


class FakeClock:
    """A controlled clock for the queue's `clock=` parameter: time moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self.now = start or utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# -- artifacts --------------------------------------------------------------------------------


@contextlib.contextmanager
def leased_mapping(path: Path, **expected: str | None) -> Iterator[memoryview]:
    """`path` mapped and checked as a serving load does for a runtime that deserializes from memory
    (a read lease, `core.verifiedread.map_file` and its `verify` against `expected`): the view, then
    unmapped and the lease given back. Skips where this host gives no read lease (a load reads a
    verified copy there)."""
    from enginecache.core.filelease import take_read_lease
    from enginecache.core.verifiedread import map_file

    lease = take_read_lease(str(path))
    if lease is None:
        pytest.skip("no read lease on this host's temporary folder: a load reads a verified copy here")
    with lease, map_file(lease, name=path) as mapping:
        mapping.verify(**expected)
        yield mapping.view


def corrupt_blob(path: Path, offset: int | None = None, *, mask: int = 0xFF) -> int:
    """Flip bits of one byte of a stored blob (or any file) in place: same inode, same size, its
    mode kept (blobs are read-only). `offset` defaults to the middle; negative counts from the
    end. Returns the offset changed."""
    mode = stat.S_IMODE(path.stat().st_mode)
    size = path.stat().st_size
    at = size // 2 if offset is None else offset % size
    path.chmod(mode | stat.S_IWUSR)
    try:
        with open(path, "r+b") as stream:
            stream.seek(at)
            (byte,) = stream.read(1)
            stream.seek(at)
            stream.write(bytes([byte ^ mask]))
    finally:
        path.chmod(mode)
    return at


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll `predicate` every 50 ms until it holds; an AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def files_under(root: Path) -> list[Path]:
    """Every file below `root`, relative to it, sorted (temp and staging files included); [] if
    `root` does not exist."""
    if not root.exists():
        return []
    return sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file() or p.is_symlink())


# -- models -----------------------------------------------------------------------------------


@pytest.fixture
def mlp(tmp_path: Path) -> Path:
    """A small MLP, `input[batch, 16] -> output[batch, 32]` (modelfactory.make_mlp)."""
    from tests.modelfactory import make_mlp

    return make_mlp(tmp_path / "src" / "mlp.onnx")


@pytest.fixture
def conv(tmp_path: Path) -> Path:
    """A small conv net, `input[batch, 3, 32, 32] -> output[batch, 10]` (modelfactory.make_conv)."""
    from tests.modelfactory import make_conv

    return make_conv(tmp_path / "src" / "conv.onnx")


@pytest.fixture
def no_modelopt(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behave as if NVIDIA ModelOpt were not installed."""
    from enginecache.core.precision import availability

    monkeypatch.setattr(availability, "modelopt_available", lambda: False)


# -- the dashboard tests' seeded catalog -------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def component_manifests_scanned_once() -> Iterator[None]:
    """Streamlit's AppTest scans every installed distribution for component manifests each time a
    new AppTest first runs (about 0.5 s); what is installed does not change during the session, so
    the scan runs once and its answer is reused. A `streamlit run` scans once at its start likewise."""
    if "streamlit" not in sys.modules:  # no test module collected uses Streamlit
        yield
        return
    from streamlit.components.v2 import manifest_scanner

    with pytest.MonkeyPatch.context() as patch:
        scan = functools.cache(manifest_scanner.scan_component_manifests)
        patch.setattr(manifest_scanner, "scan_component_manifests", lambda max_workers=None: list(scan()))
        yield


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> SeedIds:
    """The dashboard tests' catalog, built once per test module: a model, its READY engine, a worker
    and a failed job."""
    from tests.dashboardkit import seed_catalog

    root = tmp_path_factory.mktemp(f"{request.module.__name__.rsplit('.', 1)[-1]}-seed")
    return seed_catalog(root / "home", root / "models")


@pytest.fixture
def seeded(seed: SeedIds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Seeded]:
    """This test's own copy of the seeded catalog (tests may submit, verify and retire in it)."""
    from tests.dashboardkit import copy_catalog

    copy = copy_catalog(seed, tmp_path / "home", monkeypatch)
    yield copy
    copy.app.close()


@pytest.fixture
def intervals(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Each dashboard live section's `run_every`, by its name, as the view declared it in its last run."""
    import streamlit

    from enginecache.dashboard import live

    seen: dict[str, Any] = {}
    real = streamlit.fragment

    def spy(func: Callable[..., Any] | None = None, **kwargs: Any) -> Any:
        if func is not None:
            seen[func.__name__] = kwargs.get("run_every")
        return real(func, **kwargs)

    monkeypatch.setattr(live.st, "fragment", spy)
    yield seen
