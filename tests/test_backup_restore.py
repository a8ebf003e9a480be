"""Backup and restore (service.maintenance.backup.usecases) on real SQLite and PostgreSQL catalogs, real ORT engines and
real model bundles (one with external data): a backup taken while another thread keeps registering
models and building engines restores into an empty home where `verify --all` passes; what restore
and backup refuse, and that a refusal leaves nothing behind.

The concurrent writes are ordered, not timed: the backup's progress callback, called once the
catalog's snapshot is taken and before any blob is copied, waits until the writer has committed two
more models and engines, so writes land between the snapshot and the copy every run.
"""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from enginecache.db.catalog import head_revision
from enginecache.db.models import EngineStatus
from enginecache.db.reader import sqlite_file
from enginecache.errors import BackupRefusedError, IntegrityCheckError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import list_engines, retire_engine
from enginecache.service.maintenance.backup.usecases import backup, restore
from enginecache.service.models.register import register_model
from tests.backupkit import backup_manifest, rewrite_manifest
from tests.clirunner import run_cli
from tests.conftest import _pg_database, corrupt_blob, files_under, skip_or_fail
from tests.modelfactory import make_external_data_model, make_mlp

WAIT_SECONDS = 120  # a guard against a hang, never a timing the test relies on


def _is_postgres(ctx: AppContext) -> bool:
    return ctx.db_url.startswith("postgresql")


def _require_pg_client(url: str) -> None:
    """pg_dump and pg_restore on PATH, of the server's major version."""
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.connect() as connection:
            server = int(connection.exec_driver_sql("SHOW server_version_num").scalar() or 0) // 10000
    finally:
        engine.dispose()
    for tool in ("pg_dump", "pg_restore"):
        path = shutil.which(tool)
        if path is None:
            skip_or_fail(f"{tool} is not installed (the PostgreSQL client programs): PostgreSQL backups need it")
            return
        words = subprocess.run([path, "--version"], capture_output=True, text=True, check=True).stdout
        found = re.search(r"\s(\d+)", words)
        if found is None or int(found.group(1)) != server:
            skip_or_fail(f"{tool} is {words.strip()!r}, not of the server's major version {server}")


@pytest.fixture
def home_ctx(catalog_ctx: AppContext, tmp_path: Path) -> AppContext:
    """The catalog_ctx home with two models (one with external data) and an ORT engine of each."""
    if _is_postgres(catalog_ctx):
        _require_pg_client(catalog_ctx.db_url)
    register_model(catalog_ctx, make_mlp(tmp_path / "src" / "alpha.onnx", seed=1), name="alpha")
    register_model(catalog_ctx, make_external_data_model(tmp_path / "src" / "ext"), name="ext")
    for name in ("alpha", "ext"):
        build_engine(catalog_ctx, BuildRequest(model=name, backend="ort"))
    return catalog_ctx


@pytest.fixture
def empty_target(catalog_ctx: AppContext, tmp_path: Path) -> Iterator[Callable[[], AppContext]]:
    """Makes app contexts on a new home (and, on PostgreSQL, a new empty database) of catalog_ctx's kind."""
    opened: list[AppContext] = []
    databases: list[Iterator[str]] = []

    def make() -> AppContext:
        url = None
        if _is_postgres(catalog_ctx):
            database = _pg_database()
            url = next(database)
            databases.append(database)
        ctx = AppContext.from_settings(tmp_path / f"restored{len(opened)}", url)
        opened.append(ctx)
        return ctx

    yield make
    for ctx in opened:
        ctx.close()
    for database in databases:
        next(database, None)  # past its yield: drops the database


def _tables(ctx: AppContext) -> list[str]:
    """The tables in the target catalog (without opening it through Catalog, which would create them)."""
    if not _is_postgres(ctx):
        path = sqlite_file(ctx.db_url)
        assert path is not None
        if not Path(path).exists():
            return []
    engine = sa.create_engine(ctx.db_url)
    try:
        return sorted(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _leftovers(folder: Path) -> list[str]:
    """Half-made backup or restore folders beside `folder`'s entries."""
    return sorted(p.name for p in folder.iterdir() if ".partial-" in p.name or ".restore-" in p.name)


def _assert_restore_fails_leaving_nothing(target: AppContext, dest: Path, tmp_path: Path, match: str) -> None:
    """restore(target, dest) fails its integrity check (IntegrityCheckError matching `match`) and
    leaves no home, no tables in the target catalog and no half-made folder beside `tmp_path`'s."""
    with pytest.raises(IntegrityCheckError, match=match):
        restore(target, dest)
    assert not target.home.exists()
    assert _tables(target) == []
    assert _leftovers(tmp_path) == []


# -- a backup under concurrent writes, restored -----------------------------------------------


def test_backup_while_writing_restores_and_verifies(
    home_ctx: AppContext, empty_target: Callable[[], AppContext], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    writer = AppContext.from_settings(home_ctx.home, home_ctx.db_url)
    written: list[str] = []
    errors: list[BaseException] = []
    changed = threading.Condition()
    stop = threading.Event()

    def write() -> None:
        try:
            while not stop.is_set():
                name = f"w{len(written) + 1}"
                source = make_mlp(tmp_path / "writes" / f"{name}.onnx", seed=100 + len(written))
                register_model(writer, source, name=name)
                build_engine(writer, BuildRequest(model=name, backend="ort"))
                with changed:
                    written.append(name)
                    changed.notify_all()
        except BaseException as err:  # noqa: BLE001 - not swallowed: the test thread fails with it
            with changed:
                errors.append(err)
                changed.notify_all()

    def wait_for_writes(count: int) -> None:
        with changed:
            assert changed.wait_for(lambda: len(written) >= count or errors, timeout=WAIT_SECONDS)
        assert not errors, errors

    def progress(phase: str, _message: str) -> None:
        if phase == "snapshot":  # snapshot taken, no blob copied yet: let two more writes commit
            wait_for_writes(len(written) + 2)

    thread = threading.Thread(target=write, name="writer")
    thread.start()
    try:
        wait_for_writes(1)
        result = backup(home_ctx, tmp_path / "backup", progress=progress)
    finally:
        stop.set()
        thread.join(WAIT_SECONDS)
        writer.close()
    assert not thread.is_alive() and not errors, errors

    manifest = backup_manifest(result.dest)
    live_engines = len(list_engines(home_ctx))
    assert manifest["catalog"]["kind"] == ("postgresql" if _is_postgres(home_ctx) else "sqlite")
    assert manifest["catalog"]["alembic_revision"] == head_revision()
    assert manifest["enginecache_version"] and manifest["created_at"]
    backed_up_models = manifest["catalog"]["tables"]["models"]
    assert 3 <= backed_up_models < 2 + len(written)  # the snapshot: writes after it are not in the backup
    assert live_engines > manifest["catalog"]["tables"]["engines"]
    assert manifest["skipped"] == {"blobs": [], "models": []}
    assert {f["name"] for m in manifest["models"] for f in m["files"]} >= {"ext.onnx", "ext.onnx.data"}

    target = empty_target()
    restored = restore(target, result.dest)
    assert restored.revision == head_revision()
    assert restored.tables == manifest["catalog"]["tables"]
    ready = [e for e in list_engines(target) if e.status == EngineStatus.READY]
    assert len(ready) == len(manifest["blobs"])  # (an engine PENDING at the snapshot has no blob yet)

    verified = run_cli(capsys, "--home", str(target.home), "--db", target.db_url, "verify", "--all", "--json")
    assert verified.code == 0, verified.err
    results = verified.json()
    assert results and all(r["ok"] for r in results), results
    engine_results = [r for r in results if r.get("kind", "engine") == "engine"]
    assert sorted(r["id"] for r in engine_results) == sorted(e.id or 0 for e in ready)
    if not _is_postgres(target):
        with sqlite3.connect(target.home / "catalog.db") as connection:
            assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert _leftovers(tmp_path) == []


# -- what restore refuses ---------------------------------------------------------------------


def test_restore_refuses_a_home_or_catalog_that_holds_something(
    home_ctx: AppContext, empty_target: Callable[[], AppContext], tmp_path: Path
) -> None:
    dest = backup(home_ctx, tmp_path / "backup").dest

    busy = empty_target()
    busy.home.mkdir()
    (busy.home / "notes.txt").write_text("mine")
    with pytest.raises(BackupRefusedError, match=r"home .* is not empty \(notes.txt\)"):
        restore(busy, dest)
    assert files_under(busy.home) == [Path("notes.txt")]
    assert _tables(busy) == []

    # an empty home, but the catalog is the source's own, which has rows
    with_rows = AppContext.from_settings(tmp_path / "fresh", home_ctx.db_url)
    with pytest.raises(BackupRefusedError, match=r"already has rows|already exists and has rows"):
        restore(with_rows, dest)
    assert not with_rows.home.exists()
    assert _leftovers(tmp_path) == []

    # a catalog opened (so migrated) but never written: PostgreSQL takes it, a SQLite file is refused
    opened = empty_target()
    assert opened.catalog is not None
    opened.close()
    if _is_postgres(opened):
        assert restore(opened, dest).tables == backup_manifest(dest)["catalog"]["tables"]
    else:
        with pytest.raises(BackupRefusedError, match=r"not empty \(catalog.db\)"):
            restore(opened, dest)


@pytest.mark.parametrize("damaged", ["engine blob", "external data", "catalog"])
def test_restore_refuses_a_damaged_backup_naming_the_file(
    home_ctx: AppContext, empty_target: Callable[[], AppContext], tmp_path: Path, damaged: str
) -> None:
    dest = backup(home_ctx, tmp_path / "backup").dest
    manifest = backup_manifest(dest)
    if damaged == "engine blob":
        path = dest / manifest["blobs"][0]["path"]
    elif damaged == "external data":
        path = dest / next(f["path"] for m in manifest["models"] for f in m["files"] if f["name"].endswith(".data"))
    else:
        path = dest / manifest["catalog"]["file"]
    corrupt_blob(path, offset=-1)

    _assert_restore_fails_leaving_nothing(empty_target(), dest, tmp_path, re.escape(str(path)) + " is damaged")


def test_restore_failing_after_the_catalog_is_back_leaves_nothing(
    home_ctx: AppContext, empty_target: Callable[[], AppContext], tmp_path: Path
) -> None:
    """The row counts are checked once the catalog is back (the SQLite file copied, or pg_restore
    committed): a mismatch removes it again (PostgreSQL: the restored tables are dropped)."""
    dest = backup(home_ctx, tmp_path / "backup").dest
    manifest = backup_manifest(dest)
    manifest["catalog"]["tables"]["models"] += 1
    rewrite_manifest(dest, manifest)

    _assert_restore_fails_leaving_nothing(
        empty_target(), dest, tmp_path, r"rows differ .* models \(2 restored, 3 recorded\)"
    )


def test_restore_refuses_what_it_cannot_read(
    home_ctx: AppContext, empty_target: Callable[[], AppContext], tmp_path: Path
) -> None:
    target = empty_target()
    (tmp_path / "nothing").mkdir()
    with pytest.raises(BackupRefusedError, match="not an enginecache backup"):
        restore(target, tmp_path / "nothing")

    dest = backup(home_ctx, tmp_path / "backup").dest
    other_kind = AppContext.from_settings(
        tmp_path / "other", None if _is_postgres(home_ctx) else "postgresql://postgres@127.0.0.1:5432/unused"
    )
    with pytest.raises(BackupRefusedError, match="catalog and the target catalog"):
        restore(other_kind, dest)

    manifest = backup_manifest(dest)
    manifest["catalog"]["alembic_revision"] = "9999"
    rewrite_manifest(dest, manifest)
    with pytest.raises(BackupRefusedError, match="revision 9999, which this enginecache does not know"):
        restore(target, dest)
    assert not target.home.exists()
    assert _tables(target) == []


# -- what backup refuses or leaves out --------------------------------------------------------


def test_backup_fails_on_a_damaged_ready_blob_and_leaves_out_a_retired_one(
    home_ctx: AppContext, tmp_path: Path
) -> None:
    retired, ready = sorted(list_engines(home_ctx), key=lambda e: e.id or 0)
    retire_engine(home_ctx, retired.id or 0)
    corrupt_blob(home_ctx.home / (retired.blob_path or ""))
    result = backup(home_ctx, tmp_path / "first")
    assert [s["engine_ids"] for s in result.manifest["skipped"]["blobs"]] == [[retired.id]]
    assert [b["sha256"] for b in result.manifest["blobs"]] == [ready.sha256]

    damaged = home_ctx.home / (ready.blob_path or "")
    corrupt_blob(damaged)
    with pytest.raises(IntegrityCheckError, match=f"blob {ready.sha256} of engine {ready.id} .*damaged"):
        backup(home_ctx, tmp_path / "second")
    assert not (tmp_path / "second").exists()
    assert _leftovers(tmp_path) == []

    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("x")
    with pytest.raises(BackupRefusedError, match="not an empty folder"):
        backup(home_ctx, tmp_path / "taken")
    with pytest.raises(BackupRefusedError, match="inside the home"):
        backup(home_ctx, home_ctx.home / "backup")
