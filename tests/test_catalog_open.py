"""Opening the catalog: an up-to-date one is checked without Alembic, an out-of-date or empty one still
migrates, and the stdlib reader's view of the tables agrees with the SQLModel tables."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlmodel import SQLModel

import enginecache.db.models  # noqa: F401  (registers the tables on SQLModel.metadata)
from enginecache.db import catalog as catalog_module
from enginecache.db import catalogfile
from enginecache.db.catalog import MIGRATIONS_DIR, Catalog
from enginecache.db.reader import COLUMN_KINDS, SqliteReader, head_revision, sqlite_file, sqlite_url
from enginecache.db.types import UTCDateTime

ROOT = Path(__file__).resolve().parents[1]

# Opens the catalog at argv[1] in a new process; prints its schema version and what got imported.
OPEN_IN_A_NEW_PROCESS = """
import json, sys
from enginecache.db.catalog import Catalog
catalog = Catalog(sys.argv[1])
with catalog.connect() as connection:
    versions = [row[0] for row in connection.exec_driver_sql("SELECT version_num FROM alembic_version")]
catalog.dispose()
print(json.dumps({"versions": versions, "modules": sorted(m.split(".")[0] for m in sys.modules)}))
"""


def _alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    return config


def _open_in_a_new_process(url: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", OPEN_IN_A_NEW_PROCESS, url], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, list[str]] = json.loads(done.stdout)
    return result


def _migrate_to(url: str, revision: str) -> None:
    """An older schema, as an earlier release left it: Alembic straight to `revision`."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as connection:
            config = _alembic_config(url)
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def test_head_revision_is_alembics_head() -> None:
    heads = ScriptDirectory.from_config(_alembic_config("sqlite://")).get_heads()
    assert heads == [head_revision()]


def test_head_revision_reads_each_migrations_own_revisions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every migration's `revision` and `down_revision`, as Alembic reads them, and None where the
    files do not name one head (a branch, a file without a revision)."""
    script = ScriptDirectory.from_config(_alembic_config("sqlite://"))
    for migration in script.walk_revisions():
        text = Path(str(migration.path)).read_text(encoding="utf-8")
        assert catalogfile._quoted(catalogfile._assigned(text, "revision") or "") == [migration.revision]
        down = migration.down_revision
        downs = [] if down is None else [down] if isinstance(down, str) else list(down)
        assert catalogfile._quoted(catalogfile._assigned(text, "down_revision") or "") == downs
    assert catalogfile._quoted("('0012', \"0013\")") == ["0012", "0013"]
    assert catalogfile._assigned('revisions = "x"\nrevision: str = "y"\n', "revision") == '"y"'
    folder = tmp_path / "versions"
    folder.mkdir()
    (folder / "a.py").write_text('revision = "a"\ndown_revision = None\n')
    (folder / "b.py").write_text('revision = "b"\ndown_revision = "a"\n')
    monkeypatch.setattr(catalogfile, "VERSIONS_DIR", str(folder))
    catalogfile.head_revision.cache_clear()
    try:
        assert catalogfile.head_revision() == "b"
        (folder / "c.py").write_text('revision = "c"\ndown_revision = "a"\n')  # a branch: two heads
        catalogfile.head_revision.cache_clear()
        assert catalogfile.head_revision() is None
    finally:
        catalogfile.head_revision.cache_clear()


@pytest.mark.slow
def test_an_up_to_date_catalog_opens_without_alembic(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "catalog.db")
    Catalog(url).dispose()  # create and migrate
    opened = _open_in_a_new_process(url)
    assert opened["versions"] == [head_revision()]
    assert "alembic" not in opened["modules"]
    assert "sqlmodel" not in opened["modules"], "opening a catalog builds no SQLModel tables"


@pytest.mark.postgres
def test_an_up_to_date_postgres_catalog_opens_without_alembic(pg_url: str) -> None:
    Catalog(pg_url).dispose()
    opened = _open_in_a_new_process(pg_url)
    assert opened["versions"] == [head_revision()]
    assert "alembic" not in opened["modules"]


@pytest.mark.postgres
def test_a_postgres_read_runs_each_statement_on_its_own(pg_url: str) -> None:
    """`Catalog.read()` on PostgreSQL is in autocommit (no BEGIN / ROLLBACK round trips around a
    lookup): two statements of one read session are two transactions, where a session of the
    writer's shares one."""
    catalog = Catalog(pg_url)
    try:
        stamp = sa.text("SELECT transaction_timestamp()")
        with catalog.read() as session:
            first, second = session.execute(stamp).scalar(), session.execute(stamp).scalar()
        assert first != second, "a read session's statements ran in one transaction"
        with catalog.write() as session:
            first, second = session.execute(stamp).scalar(), session.execute(stamp).scalar()
        assert first == second
        with catalog.read() as session:  # rows through ConnectionRows need no server-side cursor here
            source = catalog_module.ConnectionRows(session.connection())
            rows = list(source.rows("SELECT 1 AS one", {}, [("one", None)]))
        assert rows == [(1,)]
    finally:
        catalog.dispose()


@pytest.mark.slow
def test_an_out_of_date_catalog_still_migrates(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "catalog.db")
    _migrate_to(url, "0005")
    assert SqliteReader.open(url) is None, "the stdlib reader serves only a catalog at the head revision"
    opened = _open_in_a_new_process(url)
    assert opened["versions"] == [head_revision()]
    assert "alembic" in opened["modules"]


@pytest.mark.slow
def test_an_empty_database_is_created_and_migrated(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path / "new.db")
    opened = _open_in_a_new_process(url)
    assert opened["versions"] == [head_revision()]


def test_migrate_runs_alembic_only_when_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = sqlite_url(tmp_path / "catalog.db")
    Catalog(url).dispose()
    upgrades: list[str] = []
    monkeypatch.setattr(Catalog, "_upgrade", lambda self: upgrades.append(self.url))
    monkeypatch.setattr(catalog_module, "_MIGRATED", set())
    Catalog(url).dispose()
    assert upgrades == [], "at the head revision: no Alembic"
    with sqlite3.connect(tmp_path / "catalog.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0005'")
    catalog_module._MIGRATED.clear()  # a new process: it has not migrated this URL yet
    Catalog(url).dispose()
    assert upgrades == [url]


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:////abs/catalog.db", "/abs/catalog.db"),
        ("sqlite:///rel/catalog.db", "rel/catalog.db"),
        ("sqlite://", None),
        ("sqlite:///:memory:", None),
        ("sqlite:///x.db?mode=ro", None),
        ("sqlite+pysqlite:///x.db", None),
        ("postgresql://postgres@127.0.0.1/test", None),
    ],
)
def test_the_stdlib_reader_takes_plain_sqlite_file_urls_only(url: str, path: str | None) -> None:
    assert sqlite_file(url) == path


def test_the_stdlib_reader_leaves_a_missing_file_alone(tmp_path: Path) -> None:
    missing = tmp_path / "missing.db"
    assert SqliteReader.open(sqlite_url(missing)) is None
    assert not missing.exists(), "a read never creates a catalog (the SQLAlchemy path creates and migrates)"


def _kind(column: sa.Column[object]) -> str:
    if isinstance(column.type, sa.JSON):
        return "json"
    if isinstance(column.type, UTCDateTime):
        return "time"
    if isinstance(column.type, sa.Boolean):
        return "bool"
    return ""


@pytest.mark.parametrize("table", sorted(COLUMN_KINDS))
def test_reader_column_kinds_match_the_sqlmodel_tables(table: str) -> None:
    columns = SQLModel.metadata.tables[table].columns
    for name, kind in COLUMN_KINDS[table].items():
        assert name in columns, f"{table}.{name} is not a column of the SQLModel table"
        assert _kind(columns[name]) == kind, f"{table}.{name}: the reader decodes it as {kind!r}"
