"""The audit log's hash chain (`db.auditchain`, `db.auditverify`, `enginecache audit verify`), on SQLite
and PostgreSQL: a clean log verifies, whichever writer wrote it; what someone with the catalog owner's
rights can do to the log (delete, edit, cut its end, disable or drop a trigger) is named; a consistent
rewrite is caught against a head kept elsewhere (a backup's); concurrent writers keep one chain; the
migration chains the rows written before it; a worker's start logs a missing trigger."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import typer
from alembic import command
from alembic.config import Config
from sqlmodel import select
from typer.testing import CliRunner

from enginecache.cli import auditcmd
from enginecache.cli.common import CliSettings
from enginecache.db import auditchain, engines
from enginecache.db.auditverify import trigger_problems
from enginecache.db.catalog import MIGRATIONS_DIR, Catalog
from enginecache.db.models import EngineRecord, ModelRecord
from enginecache.db.reader import sqlite_url
from enginecache.db.sqlexec import AlchemyExecutor, SqliteWrite
from enginecache.errors import BadInputError, IntegrityCheckError
from enginecache.service.access import audit
from enginecache.service.access.audit import acting_as, record
from enginecache.service.access.auditverify import report_trigger_problems, verify_catalog
from enginecache.service.context import AppContext
from enginecache.service.maintenance.backup.usecases import backup, restore
from tests.auditkit import ALICE
from tests.backupkit import backup_manifest, rewrite_manifest
from tests.clirunner import run_cli

WRITERS = 8
EVENTS_EACH = 12


def _cli(app: AppContext) -> typer.Typer:
    cli = typer.Typer()

    @cli.callback()
    def root(ctx: typer.Context) -> None:
        ctx.obj = CliSettings(app.home, app.db_url)

    auditcmd.register(cli)
    return cli


def _verify(app: AppContext, *args: str) -> tuple[int, dict[str, Any], str]:
    """`enginecache audit verify --json`: its exit code, its one document, its stderr."""
    done = CliRunner().invoke(_cli(app), ["audit", "verify", "--json", *args])
    return done.exit_code, json.loads(done.stdout), done.stderr


def _engine(app: AppContext) -> int:
    with app.catalog.write() as session:
        model = session.exec(select(ModelRecord)).first()
        if model is None:
            model = ModelRecord(name="m", digest="d" * 64, filename="m.onnx", store_path="models/d", size_bytes=1)
            session.add(model)
            session.flush()
        engine = EngineRecord(
            model_id=model.id or 0,
            backend="ort",
            backend_version="1",
            precision="fp32",
            targets="x86_64",
            cache_key="k" * 64,
            status="READY",
            onnx_digest=model.digest,
            os="linux",
        )
        session.add(engine)
    return engine.id or 0


def _events(app: AppContext) -> list[int]:
    """Five events by both writers (`record`, the engine gateway); their ids in order."""
    with acting_as(ALICE):
        record(app, audit.MODEL_REGISTER, "model 1", {"name": "mlp", "size": 1.5, "tags": ["a", "é"]})
        record(app, audit.BUILD_SUBMIT, "job 1")
    engine_id = _engine(app)
    with app.catalog.changes() as ex:
        engines.mark_corrupt(ex, engine_id, actor=ALICE, by="verify", reason="sha256 differs")
    with app.catalog.changes() as ex:
        engines.retire(ex, engine_id, at=datetime.now(UTC), actor=ALICE, by="retire")
    record(app, audit.GC_APPLY, "store", {"removed": 0})
    return _ids(app)


def _ids(app: AppContext) -> list[int]:
    with app.catalog.engine.connect() as connection:
        return [int(r[0]) for r in connection.exec_driver_sql("SELECT id FROM audit_events ORDER BY id")]


def _as_owner(app: AppContext, *statements: str) -> None:
    """Run `statements` as the catalog's owner would to change the log unseen: the append-only
    triggers taken out of the way first and put back as they were afterwards."""
    with app.catalog.engine.begin() as connection:
        if app.catalog.is_sqlite:
            saved = list(
                connection.exec_driver_sql(
                    "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'audit_events'"
                )
            )
            for name, _sql in saved:
                connection.exec_driver_sql(f"DROP TRIGGER {name}")
        else:
            connection.exec_driver_sql("ALTER TABLE audit_events DISABLE TRIGGER USER")
        for statement in statements:
            connection.exec_driver_sql(statement)
        if app.catalog.is_sqlite:
            for _name, sql in saved:
                connection.exec_driver_sql(sql)
        else:
            connection.exec_driver_sql("ALTER TABLE audit_events ENABLE TRIGGER USER")


def _rehash_from(app: AppContext, first: int) -> tuple[int, str]:
    """Compute every hash from row `first` on again and move the head (a consistent rewrite, as the
    owner could do it knowing the chain's format); the new last row's id and hash."""
    with app.catalog.engine.connect() as connection:
        rows = list(
            connection.exec_driver_sql(
                "SELECT id, at, actor, origin, action, target, details, prev_id, prev_hash FROM audit_events "
                "ORDER BY id"
            )
        )
    statements, prev_hash = [], ""
    for row_id, at, actor, origin, action, target, details, prev_id, stored_prev in rows:
        if row_id < first:
            continue
        link = stored_prev if row_id == first else prev_hash
        prev_hash = auditchain.row_hash(prev_id, link, at, actor, origin, action, target, details)
        statements.append(f"UPDATE audit_events SET prev_hash = '{link}', row_hash = '{prev_hash}' WHERE id = {row_id}")
    last = int(rows[-1][0])
    statements.append(f"UPDATE audit_chain_head SET last_id = {last}, last_hash = '{prev_hash}'")
    _as_owner(app, *statements)
    return last, prev_hash


# -- what verify finds -------------------------------------------------------------------------


def test_a_clean_log_verifies_whichever_writer_wrote_it(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    code, report, _ = _verify(app)
    assert (code, report["ok"], report["rows"], report["head"]) == (0, True, 0, {"id": None, "hash": "0" * 64})
    ids = _events(app)
    if app.catalog.is_sqlite:  # a cache hit's stdlib connection writes through the same chain
        engine_id = _engine(app)
        connection = sqlite3.connect(app.home / "catalog.db", isolation_level=None)
        try:
            with SqliteWrite(connection) as ex:
                engines.mark_corrupt(ex, engine_id, actor=ALICE, by="load_or_build", reason="blake3 differs")
        finally:
            connection.close()
        ids = _ids(app)
    code, report, err = _verify(app)
    assert code == 0, err
    assert report["ok"] and report["broken"] is None and report["triggers"] == {"ok": True, "problems": []}
    assert report["rows"] == len(ids) and report["last"] == report["head"] and report["last"]["id"] == ids[-1]
    text = CliRunner().invoke(_cli(app), ["audit", "verify"])
    assert text.exit_code == 0 and "intact" in text.stdout and "in place" in text.stdout
    listed = CliRunner().invoke(_cli(app), ["audit", "--json"])  # the listing is still `audit`
    assert [e["id"] for e in json.loads(listed.stdout)] == ids[::-1]


def test_a_deleted_row_is_named(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    ids = _events(app)
    _as_owner(app, f"DELETE FROM audit_events WHERE id = {ids[2]}")
    code, report, err = _verify(app)
    assert code == 1
    assert report["broken"]["kind"] == "deleted" and report["broken"]["row_id"] == ids[2]
    assert f"row {ids[2]} is missing: row {ids[3]} follows it" in report["broken"]["message"]
    assert report["triggers"]["ok"], "the owner put the triggers back: only the chain shows the deletion"
    assert f"row {ids[2]}" in err


def test_an_edited_row_is_named(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    ids = _events(app)
    _as_owner(app, f"UPDATE audit_events SET actor = 'mallory' WHERE id = {ids[1]}")
    code, report, err = _verify(app)
    assert code == 1 and report["broken"]["kind"] == "edited" and report["broken"]["row_id"] == ids[1], err
    assert report["last"]["id"] == ids[0]  # the last row that held
    assert f"row {ids[1]} was changed" in err


def test_an_edited_row_whose_hash_was_computed_again_is_named(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    ids = _events(app)
    with app.catalog.engine.connect() as connection:
        (at, origin, action, target, prev_id, prev_hash) = connection.exec_driver_sql(
            f"SELECT at, origin, action, target, prev_id, prev_hash FROM audit_events WHERE id = {ids[1]}"
        ).one()
    forged = auditchain.row_hash(prev_id, prev_hash, at, "mallory", origin, action, target, {})
    _as_owner(
        app, f"UPDATE audit_events SET actor = 'mallory', details = '{{}}', row_hash = '{forged}' WHERE id = {ids[1]}"
    )
    code, report, _ = _verify(app)
    assert code == 1 and report["broken"]["kind"] == "relinked" and report["broken"]["row_id"] == ids[1]


def test_rows_cut_from_the_end_are_found(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    ids = _events(app)
    _as_owner(app, f"DELETE FROM audit_events WHERE id >= {ids[3]}")
    code, report, _ = _verify(app)
    assert code == 1 and report["broken"]["kind"] == "head" and report["broken"]["row_id"] == ids[-1]
    assert f"the log ends at row {ids[2]}" in report["broken"]["message"]


@pytest.mark.parametrize("how", ["disabled", "dropped"])
def test_a_disabled_or_dropped_trigger_is_named(catalog_ctx: AppContext, how: str) -> None:
    app = catalog_ctx
    ids = _events(app)
    sqlite = app.catalog.is_sqlite
    name = "audit_events_no_delete" if sqlite else "audit_events_no_change"
    with app.catalog.engine.begin() as connection:
        if how == "dropped":
            connection.exec_driver_sql(f"DROP TRIGGER {name}" + ("" if sqlite else " ON audit_events"))
        elif sqlite:  # SQLite cannot disable a trigger: the same trigger, made to fire never
            connection.exec_driver_sql(f"DROP TRIGGER {name}")
            connection.exec_driver_sql(
                f"CREATE TRIGGER {name} BEFORE DELETE ON audit_events WHEN 0 "
                "BEGIN SELECT RAISE(ABORT, 'audit_events is append-only'); END"
            )
        else:
            connection.exec_driver_sql(f"ALTER TABLE audit_events DISABLE TRIGGER {name}")
    code, report, err = _verify(app)
    assert code == 1 and report["broken"] is None, "the chain still holds: only the trigger is named"
    assert not report["triggers"]["ok"]
    [problem] = report["triggers"]["problems"]
    assert name in problem and ("missing" if how == "dropped" else ("changed" if sqlite else "disabled")) in problem
    assert name in err

    with app.catalog.engine.begin() as connection:  # and what the trigger no longer stops is found too
        connection.exec_driver_sql(f"DELETE FROM audit_events WHERE id = {ids[0]}")
    code, report, _ = _verify(app)
    assert code == 1 and report["broken"]["kind"] == "deleted" and report["broken"]["row_id"] == ids[0]


def test_a_consistent_rewrite_is_caught_against_a_head_kept_elsewhere(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    _events(app)
    _code, kept, _ = _verify(app)
    head = f"{kept['head']['id']}:{kept['head']['hash']}"
    assert _verify(app, "--head", head)[0] == 0
    ids = _ids(app)
    _as_owner(app, f"UPDATE audit_events SET actor = 'mallory' WHERE id = {ids[1]}")
    _rehash_from(app, ids[1])
    assert _verify(app)[0] == 0, "a rewrite of the chain and its head is consistent in itself"
    code, report, _ = _verify(app, "--head", head)
    assert code == 1 and report["broken"]["kind"] == "anchor" and report["broken"]["row_id"] == ids[-1]
    bad = CliRunner().invoke(_cli(app), ["audit", "verify", "--json", "--head", "12:nothex"])
    assert isinstance(bad.exception, BadInputError) and "ID:HASH" in str(bad.exception)  # exit 2 from main


def test_verify_through_the_entry_point_one_document_and_its_exit_codes(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = app_ctx
    ids = _events(app)
    home = str(app.home)
    ok = run_cli(capsys, "--home", home, "audit", "verify", "--json")
    assert ok.code == 0 and ok.json()["ok"], ok.err
    _as_owner(app, f"DELETE FROM audit_events WHERE id = {ids[1]}")
    broken = run_cli(capsys, "--home", home, "audit", "verify", "--json")
    assert broken.code == 1 and broken.json()["broken"]["row_id"] == ids[1]  # the whole of stdout: one document
    assert f"error: audit chain broken: row {ids[1]} is missing" in broken.err
    away = run_cli(
        capsys, "--home", str(tmp_path / "h"), "--db", "postgresql://nobody@127.0.0.1:1/x", "audit", "verify", "--json"
    )
    assert away.code == 3 and away.json()["exit_code"] == 3 and "cannot reach the catalog" in away.json()["error"]


# -- concurrent writers ------------------------------------------------------------------------


def test_concurrent_writers_keep_one_chain(catalog_ctx: AppContext) -> None:
    app = catalog_ctx
    engine_ids = [_engine(app) for _ in range(WRITERS)]
    start = threading.Barrier(WRITERS)
    errors: list[BaseException] = []

    def write(n: int) -> None:
        try:
            start.wait()
            for i in range(EVENTS_EACH):
                if i == EVENTS_EACH // 2:  # the gateway's writer, in its own transactions, among them
                    with app.catalog.changes() as ex:
                        engines.mark_corrupt(ex, engine_ids[n], actor=ALICE, by="check", reason="r")
                else:
                    record(app, "test.concurrent", f"writer {n}", {"i": i})
        except BaseException as err:  # noqa: BLE001 - not swallowed: asserted empty below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(n,)) for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    code, report, err = _verify(app)
    assert code == 0, err
    assert report["rows"] == WRITERS * EVENTS_EACH
    with app.catalog.engine.connect() as connection:
        links = [r[0] for r in connection.exec_driver_sql("SELECT prev_id FROM audit_events")]
    assert len(set(links)) == len(links), "no two rows follow the same row: the chain never forked"


# -- the migration -----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "catalog.db")
    url: str = request.getfixturevalue("pg_url")
    return url


def _alembic(url: str, step: Callable[[Config, str], None], revision: str) -> None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as connection:
            config = Config()
            config.set_main_option("script_location", str(MIGRATIONS_DIR))
            config.attributes["connection"] = connection
            step(config, revision)
    finally:
        engine.dispose()


def test_the_migration_chains_the_rows_written_before_it(empty_db_url: str) -> None:
    url = empty_db_url
    _alembic(url, command.upgrade, "0016")
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with engine.begin() as connection:
            for n, details in enumerate(['{"was": "READY"}', "{}", '{"n": 1.25, "s": "\\u00e9"}'], start=1):
                connection.exec_driver_sql(
                    "INSERT INTO audit_events (at, actor, origin, action, target, details) VALUES "
                    f"('2026-01-0{n} 10:00:00.00012{n}', 'alice', 'cli box pid 1', 'model.register', "
                    f"'model {n}', '{details}')"
                )
        _alembic(url, command.upgrade, "0017")
        catalog = Catalog(url, migrate=False)
        try:
            result = verify_catalog(catalog)
            assert result.ok, result.problems()
            assert result.chain.rows == 3 and result.chain.last is not None and result.chain.last[0] == 3
            with catalog.engine.connect() as connection:
                assert trigger_problems(AlchemyExecutor(connection), sqlite=catalog.is_sqlite) == []
            refused = pytest.raises(sa.exc.DBAPIError, match="append-only")
            with refused, catalog.engine.begin() as connection:
                connection.exec_driver_sql("DELETE FROM audit_events WHERE id = 2")
            with catalog.engine.begin() as connection:
                ex = AlchemyExecutor(connection)
                auditchain.append(ex, at=ex.timestamp(), actor="a", origin="o", action="x", target="t", details={})
            assert verify_catalog(catalog).ok
            with pytest.raises(sa.exc.IntegrityError), catalog.engine.begin() as connection:  # no writer skips it
                connection.exec_driver_sql(
                    "INSERT INTO audit_events (at, actor, origin, action, target, details) "
                    "VALUES ('2026-01-09 10:00:00.000000', 'a', 'o', 'x', 't', '{}')"
                )
        finally:
            catalog.dispose()
        _alembic(url, command.downgrade, "0016")
        _alembic(url, command.upgrade, "head")  # and up again over what the downgrade left
        catalog = Catalog(url, migrate=False)
        try:
            result = verify_catalog(catalog)
            assert result.ok and result.chain.rows == 4, result.problems()
        finally:
            catalog.dispose()
    finally:
        engine.dispose()


# -- at a start, and in a backup ---------------------------------------------------------------


def test_a_start_logs_a_missing_trigger(catalog_ctx: AppContext, caplog: pytest.LogCaptureFixture) -> None:
    app = catalog_ctx
    with caplog.at_level(logging.ERROR):
        assert report_trigger_problems(app) == []
    assert not caplog.records
    with app.catalog.engine.begin() as connection:
        if app.catalog.is_sqlite:
            connection.exec_driver_sql("DROP TRIGGER audit_events_no_update")
        else:
            connection.exec_driver_sql("ALTER TABLE audit_events DISABLE TRIGGER audit_events_no_truncate")
    from enginecache.service.jobs.worker import WorkerConfig, run_worker

    with caplog.at_level(logging.ERROR):
        assert run_worker(app, WorkerConfig(name="w", once=True, job_kinds=()), install_signals=False) == 0
    [logged] = [r for r in caplog.records if "not protected" in r.getMessage()]
    assert logged.levelno == logging.ERROR
    assert ("audit_events_no_update" if app.catalog.is_sqlite else "audit_events_no_truncate") in logged.getMessage()


def test_a_backup_records_the_head_and_a_restore_reaches_it(app_ctx: AppContext, tmp_path: Path) -> None:
    app = app_ctx
    for n in range(3):  # (no engine: a backup copies the blobs and bundles rows name)
        record(app, audit.ROLE_SET, f"user{n}@example.com", {"role": "viewer"})
    _code, live, _ = _verify(app)
    dest = backup(app, tmp_path / "backup").dest
    manifest = backup_manifest(dest)
    assert manifest["catalog"]["audit_head"] == live["head"]
    head = f"{live['head']['id']}:{live['head']['hash']}"
    assert _verify(app, "--head", head)[0] == 0  # the backup's head, checked against the live log

    restored = restore(AppContext.from_settings(tmp_path / "restored"), dest)
    assert restored.audit["last"] == live["head"] and restored.audit["trigger_problems"] == []

    manifest["catalog"]["audit_head"]["hash"] = "f" * 64  # a head that the backup's chain does not reach
    rewrite_manifest(dest, manifest)
    target = AppContext.from_settings(tmp_path / "again")
    with pytest.raises(IntegrityCheckError, match=rf"does not hold row {live['head']['id']}"):
        restore(target, dest)
    assert not target.home.exists()
