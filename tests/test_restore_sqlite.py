"""Restore of SQLite backups (service.maintenance.backup.usecases): the catalog file placed outside the home where the
target's --db names it so, and an older backup migrated to the head revision."""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa

from enginecache.db.catalog import MIGRATIONS_DIR, head_revision
from enginecache.db.models import EngineStatus
from enginecache.db.reader import sqlite_url
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import list_engines
from enginecache.service.maintenance.backup.usecases import backup, restore
from enginecache.service.models.register import register_model
from tests.backupkit import backup_manifest, rewrite_manifest
from tests.conftest import files_under
from tests.modelfactory import file_sha256, make_mlp


def test_restore_places_a_sqlite_catalog_outside_the_home(app_ctx: AppContext, tmp_path: Path) -> None:
    register_model(app_ctx, make_mlp(tmp_path / "src" / "alpha.onnx"), name="alpha")
    build_engine(app_ctx, BuildRequest(model="alpha", backend="ort"))
    dest = backup(app_ctx, tmp_path / "backup").dest
    elsewhere = tmp_path / "db" / "catalog.db"
    elsewhere.parent.mkdir()
    target = AppContext.from_settings(tmp_path / "restored", sqlite_url(elsewhere))
    try:
        restore(target, dest)
        assert files_under(elsewhere.parent) == [Path("catalog.db")]
        assert not (target.home / "catalog.db").exists()
        assert [e.status for e in list_engines(target)] == [EngineStatus.READY]
    finally:
        target.close()


def test_restore_migrates_an_older_sqlite_backup_to_head(app_ctx: AppContext, tmp_path: Path) -> None:
    from alembic import command
    from alembic.config import Config

    register_model(app_ctx, make_mlp(tmp_path / "src" / "alpha.onnx"), name="alpha")
    build_engine(app_ctx, BuildRequest(model="alpha", backend="ort"))
    dest = backup(app_ctx, tmp_path / "backup").dest
    catalog = dest / "catalog.db"
    engine = sa.create_engine(sqlite_url(catalog))
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "-1")
        older = connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
        left = {row[0] for row in connection.exec_driver_sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
    engine.dispose()
    assert older != head_revision()
    manifest = backup_manifest(dest)
    manifest["catalog"].update(
        tables={name: n for name, n in manifest["catalog"]["tables"].items() if name in left},  # as it was then
        alembic_revision=older,
        sha256=file_sha256(catalog),
        size=catalog.stat().st_size,
    )
    rewrite_manifest(dest, manifest)

    target = AppContext.from_settings(tmp_path / "restored")
    try:
        result = restore(target, dest)
        assert (result.revision_backup, result.revision) == (older, head_revision())
        assert [e.status for e in list_engines(target)] == [EngineStatus.READY]
    finally:
        target.close()
