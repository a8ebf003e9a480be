"""Listings and `show` views of the CLI: pages that are disjoint and cover every row, `--json` streamed as
one document, the stdlib reader and SQLAlchemy answering alike (and as the ORM records say). What a
new process imports for `--help` and these read commands: tests/test_cli_imports.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import SQLModel

from enginecache.cli import common as cli_common
from enginecache.db import reader as reader_module
from enginecache.db.models import JobStatus
from enginecache.service.builds.submit import get_job, job_to_dict
from enginecache.service.context import AppContext
from enginecache.service.engines.records import engine_to_dict, get_engine, list_engines
from enginecache.service.models.register import list_models, model_to_dict
from tests.clirunner import CliResult, run_cli

MODELS, ENGINES, JOBS = 5, 23, 17


def _insert(app: AppContext, table: str, rows: list[dict[str, Any]]) -> None:
    with app.catalog.engine.begin() as connection:
        connection.execute(sa.insert(SQLModel.metadata.tables[table]), rows)


def seed(app: AppContext) -> None:
    """Models, engines and jobs straight into the catalog, with created_at ties (ids break them), a
    QUEUED job nobody can run and one a live worker can."""
    now = datetime.now(UTC)
    _insert(
        app,
        "models",
        [
            {
                "name": f"model-{i}",
                "digest": f"{i:064x}",
                "filename": "model.onnx",
                "store_path": f"models/{i:064x}/model.onnx",
                "size_bytes": 1000 + i,
                "info": {"inputs": [{"name": "x", "dtype": "float32", "shape": ["batch", 4]}], "opsets": {"": 17}},
                "parent_id": None,
                "recipe": {} if i % 2 else {"name": "fp16"},
                "created_at": now - timedelta(hours=i // 2),  # pairs share a timestamp
            }
            for i in range(1, MODELS + 1)
        ],
    )
    _insert(
        app,
        "engines",
        [
            {
                "model_id": i % MODELS + 1,
                "backend": ("rtx", "ort")[i % 2],
                "backend_version": "1.0",
                "precision": "fp32",
                "targets": ("sm80,sm86", "x86_64-avx2")[i % 2],
                "cache_key": f"{i:064x}",
                "status": ("READY", "FAILED", "RETIRED")[i % 3],
                "onnx_digest": f"{i % MODELS + 1:064x}",
                "key_ingredients": {"schema": 1, "backend": "rtx"},
                "precision_recipe": {},
                "build_options": {"opt_level": 3},
                "target_info": {},
                "os": "Linux",
                "host": {"hostname": "h"},
                "io": [],
                "warnings": [f"warning {i}"] if i % 4 == 0 else [],
                "sha256": f"{i:064x}" if i % 3 == 0 else None,
                "size_bytes": 10 * i,
                "blob_path": f"objects/sha256/{i:02x}/{i:064x}" if i % 3 == 0 else None,
                "build_seconds": 0.5 if i % 3 == 0 else None,
                "builder_log": "a log that listings never load\n" * 3,
                "error": None if i % 3 != 1 else "a build error",
                "created_at": now - timedelta(minutes=i // 3),  # threes share a timestamp
                "finished_at": now if i % 3 == 0 else None,
            }
            for i in range(1, ENGINES + 1)
        ],
    )
    _insert(
        app,
        "workers",
        [
            {
                "name": "live-ort",
                "hostname": "h",
                "pid": 1,
                "fingerprint": {},
                "capabilities": {"backends": ["ort"]},
                "status": "online",
                "started_at": now,
                "heartbeat_at": now,
            }
        ],
    )
    statuses = [JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.QUEUED, JobStatus.DEAD]
    _insert(
        app,
        "jobs",
        [
            {
                "kind": "build",
                "status": statuses[i % 4],
                "payload": {"model": "1", "i": i},
                "requirements": {"backend": ("none-such", "ort")[(i // 4) % 2]},
                "attempts": 1,
                "max_attempts": 3,
                "timeout_seconds": 60.0,
                "cancel_requested": i % 5 == 0,
                "progress": 0.5,
                "phase": None,
                "log_tail": "tail",
                "run_after": now,
                "created_at": now,
                "updated_at": now,
            }
            for i in range(1, JOBS + 1)
        ],
    )


@pytest.fixture
def seeded(catalog_ctx: AppContext) -> AppContext:
    seed(catalog_ctx)
    return catalog_ctx


def cli(capsys: pytest.CaptureFixture[str], app: AppContext, *args: str) -> CliResult:
    return run_cli(capsys, "--home", str(app.home), "--db", app.db_url, *args)


def _json(result: CliResult) -> Any:
    assert result.code == 0, result.err
    return result.json()


def _plain(data: Any) -> Any:
    """As the CLI prints it: through JSON (datetimes and paths as text)."""
    return json.loads(json.dumps(data, default=str))


LISTINGS = {"engines": ["engine", "list"], "models": ["model", "list"], "jobs": ["jobs"]}


@pytest.mark.parametrize("what", sorted(LISTINGS))
def test_pages_are_disjoint_and_cover_every_row(
    seeded: AppContext, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    everything = [row["id"] for row in _json(cli(capsys, seeded, *LISTINGS[what], "--json"))]
    assert len(everything) == {"engines": ENGINES, "models": MODELS, "jobs": JOBS}[what]
    pages: list[list[int]] = []
    for offset in range(0, len(everything) + 4, 4):
        page = [
            row["id"]
            for row in _json(cli(capsys, seeded, *LISTINGS[what], "--json", "--limit", "4", "--offset", str(offset)))
        ]
        assert len(page) <= 4
        pages.append(page)
    flat = [row_id for page in pages for row_id in page]
    assert flat == everything, "the pages, in order, are the whole listing"
    assert len(set(flat)) == len(flat), "no row on two pages"
    assert pages[-1] == []


def test_offset_alone_skips_and_limit_alone_cuts(seeded: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    everything = [row["id"] for row in _json(cli(capsys, seeded, "engine", "list", "--json"))]
    skipped = [row["id"] for row in _json(cli(capsys, seeded, "engine", "list", "--json", "--offset", "20"))]
    cut = [row["id"] for row in _json(cli(capsys, seeded, "engine", "list", "--json", "--limit", "3"))]
    assert skipped == everything[20:]
    assert cut == everything[:3]


@pytest.mark.parametrize("args", [["--limit", "0"], ["--offset", "-1"], ["--limit", "x"]])
def test_bad_paging_is_a_usage_error(seeded: AppContext, capsys: pytest.CaptureFixture[str], args: list[str]) -> None:
    result = cli(capsys, seeded, "engine", "list", *args)
    assert result.code == 2, (result.out, result.err)
    assert result.out == "" and "Traceback" not in result.err


def test_listings_and_views_say_what_the_orm_records_say(
    seeded: AppContext, capsys: pytest.CaptureFixture[str]
) -> None:
    engines = _json(cli(capsys, seeded, "engine", "list", "--json"))
    assert engines == _plain([engine_to_dict(seeded, e) for e in list_engines(seeded)])
    models = _json(cli(capsys, seeded, "model", "list", "--json"))
    assert models == _plain([model_to_dict(seeded, m) for m in list_models(seeded)])
    jobs = _json(cli(capsys, seeded, "jobs", "--json"))
    assert jobs == _plain([job_to_dict(seeded, get_job(seeded, row["id"])) for row in jobs])
    assert [row["id"] for row in jobs] == sorted((row["id"] for row in jobs), reverse=True)
    waiting = {row["requirements"]["backend"]: row["waiting"] for row in jobs if row["status"] == "QUEUED"}
    assert waiting == {"none-such": "waiting for a worker with none-such", "ort": None}
    engine_id = engines[0]["id"]
    shown = _json(cli(capsys, seeded, "engine", "show", str(engine_id), "--json"))
    assert shown == _plain(engine_to_dict(seeded, get_engine(seeded, engine_id), detail=True))
    assert shown["builder_log"].startswith("a log")
    assert "builder_log" not in engines[0], "a listing never loads the builder log"
    job = _json(cli(capsys, seeded, "job", "show", str(jobs[0]["id"]), "--json"))
    assert job == jobs[0]
    model = _json(cli(capsys, seeded, "model", "show", "model-3", "--json"))
    assert model == next(m for m in models if m["name"] == "model-3")


def test_filters_and_a_model_that_is_not_there(seeded: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    everything = _json(cli(capsys, seeded, "engine", "list", "--json"))
    by_model = _json(cli(capsys, seeded, "engine", "list", "--json", "--model", "model-2"))
    assert by_model == [row for row in everything if row["model"] == "model-2"]
    by_status = _json(cli(capsys, seeded, "engine", "list", "--json", "--status", "ready"))
    assert by_status == [row for row in everything if row["status"] == "READY"]
    queued = _json(cli(capsys, seeded, "jobs", "--json", "--status", "queued"))
    assert queued and all(row["status"] == "QUEUED" for row in queued)
    missing = cli(capsys, seeded, "engine", "list", "--json", "--model", "nope")
    assert missing.code == 2, "an unknown model fails before anything is written"
    document = json.loads(missing.out)  # with --json the one document is the error object, no rows before it
    assert set(document) == {"error", "kind", "exit_code"} and document["kind"] == "not_found"
    assert "no model 'nope'" in missing.err
    assert cli(capsys, seeded, "engine", "show", "999999").code == 2
    assert cli(capsys, seeded, "job", "show", "999999").code == 2


def _without_stdlib_reader(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reader_module.SqliteReader, "open", classmethod(lambda cls, url: None))


READS = [
    ["engine", "list", "--json"],
    ["engine", "list"],
    ["engine", "list", "--json", "--limit", "5", "--offset", "3"],
    ["engine", "show", "3", "--json"],
    ["model", "list", "--json"],
    ["model", "list"],
    ["model", "show", "model-1", "--json"],
    ["jobs", "--json"],
    ["jobs"],
    ["job", "show", "3", "--json"],
]


def test_the_stdlib_reader_and_sqlalchemy_answer_alike(
    app_ctx: AppContext, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(app_ctx)
    assert reader_module.SqliteReader.open(app_ctx.db_url) is not None
    stdlib = [cli(capsys, app_ctx, *args) for args in READS]
    _without_stdlib_reader(monkeypatch)
    through_sqlalchemy = [cli(capsys, app_ctx, *args) for args in READS]
    for args, a, b in zip(READS, stdlib, through_sqlalchemy, strict=True):
        assert a.code == 0 and b.code == 0, (args, a.err, b.err)
        assert a.out == b.out, args


def test_streamed_json_is_one_document(
    app_ctx: AppContext, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = cli(capsys, app_ctx, "engine", "list", "--json")
    assert empty.code == 0 and empty.out == "[]\n"
    assert cli(capsys, app_ctx, "engine", "list").out == "no engines\n"
    seed(app_ctx)
    monkeypatch.setattr(cli_common, "WRITE_BATCH", 2)  # many writes ...
    monkeypatch.setattr(reader_module, "FETCH_ROWS", 3)  # ... of rows fetched a few at a time
    for args, count in ((["engine", "list"], ENGINES), (["jobs"], JOBS), (["model", "list"], MODELS)):
        result = cli(capsys, app_ctx, *args, "--json")
        assert result.code == 0, result.err
        document = json.loads(result.out)  # one document, whatever the batches
        assert isinstance(document, list) and len(document) == count
        assert result.out.startswith("[\n") and result.out.endswith("\n]\n")
        text = cli(capsys, app_ctx, *args)
        assert len(text.out.splitlines()) == count + (args != ["jobs"]), "a row each, under a header"


def test_the_text_table(seeded: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(cli(capsys, seeded, "engine", "list", "--json"))
    header, *lines = cli(capsys, seeded, "engine", "list").out.splitlines()
    assert header.split() == ["ID", "MODEL", "VER", "BACKEND", "PREC", "TARGETS", "STATUS", "SHA256"]
    assert [int(line.split()[0]) for line in lines] == [row["id"] for row in rows]
    assert lines[0].split()[1:3] == [rows[0]["model"], "v1"]
    assert lines[0][header.index("STATUS") :].startswith(rows[0]["status"]), "the columns line up"


def test_stream_rows_writes_one_array(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setattr(cli_common, "WRITE_BATCH", 2)
    line: Callable[[dict[str, Any]], str] = lambda row: str(row["i"])  # noqa: E731
    for count in (0, 1, 2, 5):
        out = io.StringIO()
        assert cli_common.stream_rows(({"i": i} for i in range(count)), True, line, "none", out=out) == count
        assert json.loads(out.getvalue()) == [{"i": i} for i in range(count)]
        text = io.StringIO()
        cli_common.stream_rows(({"i": i} for i in range(count)), False, line, "none", out=text)
        assert text.getvalue() == ("".join(f"{i}\n" for i in range(count)) if count else "none\n")


SHOWS = {"engine": "3", "job": "2", "model": "model-3"}


@pytest.mark.parametrize("what", sorted(SHOWS))
def test_show_prints_text_for_people_and_one_document_with_json(
    seeded: AppContext, capsys: pytest.CaptureFixture[str], what: str
) -> None:
    as_json = _json(cli(capsys, seeded, what, "show", SHOWS[what], "--json"))
    text = cli(capsys, seeded, what, "show", SHOWS[what])
    assert text.code == 0, text.err
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.out)  # text, not a JSON document
    assert re.match(rf"{what} {as_json['id']}\b", text.out), text.out
    assert len(text.out.splitlines()) > 2 and not text.out.lstrip().startswith(("{", "["))


def test_the_engine_and_job_text_views(seeded: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    engine = _json(cli(capsys, seeded, "engine", "show", "3", "--json"))
    lines = cli(capsys, seeded, "engine", "show", "3").out.splitlines()
    assert lines[0] == (
        f"engine 3: READY, model {engine['model']} v1 (id {engine['model_id']}), ort 1.0, fp32, targets x86_64-avx2"
    )
    assert f"blob: 30 B, sha256 {engine['sha256']}, blake3 -" in lines
    assert f"path: {engine['path']}" in lines
    assert f"cache key: {engine['cache_key']}" in lines and "  backend: rtx" in lines  # as the key recorded it
    assert lines[-4:] == ["builder log:", *["  a log that listings never load"] * 3]
    failed = cli(capsys, seeded, "engine", "show", "1").out.splitlines()  # FAILED, no blob
    assert "blob: none" in failed and "failure: a build error" in failed
    job = _json(cli(capsys, seeded, "job", "show", "2", "--json"))
    text = cli(capsys, seeded, "job", "show", "2").out.splitlines()
    assert text[0] == f"job 2: build {job['status']}, attempt 1 of 3, 50%"
    assert "request: model 1, i 2" in text and text[-2:] == ["log tail:", "  tail"]


def test_the_text_views_escape_what_the_catalog_holds(seeded: AppContext, capsys: pytest.CaptureFixture[str]) -> None:
    """A builder log or an error quoting an uploaded file's words cannot forge lines or send escapes."""
    forged = "ok\x1b[2J\rerror: forged"
    with seeded.catalog.engine.begin() as connection:
        connection.execute(sa.update(SQLModel.metadata.tables["engines"]).values(error=forged, builder_log=forged))
        connection.execute(sa.update(SQLModel.metadata.tables["jobs"]).values(error=forged, log_tail=forged))
    for what in ("engine", "job"):
        out = cli(capsys, seeded, what, "show", "3").out
        assert "\x1b" not in out and "\r" not in out, what
        assert out.count("ok\\x1b[2J\\rerror: forged") == 2, what  # the error, and the log
        assert not any(line.startswith("error: forged") for line in out.splitlines()), what
