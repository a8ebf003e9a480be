"""The stdlib cache hit (service.serving.hitpath): taken on a hit, never trusted where the full path would
answer otherwise, and recording the same event."""

from __future__ import annotations

import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory
from sqlmodel import delete, select

from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.blobpaths import blob_path
from enginecache.db import catalogfile
from enginecache.db.catalog import MIGRATIONS_DIR
from enginecache.db.models import EngineMemoRecord, EngineStatus
from enginecache.db.reader import head_revision
from enginecache.errors import EngineRejectedError, MissError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine, retire_engine
from enginecache.service.serving import hitpath, loadpath
from enginecache.service.serving.runtime import RuntimeSpec, load_or_build
from tests.conftest import corrupt_blob
from tests.modelfactory import make_mlp
from tests.servingkit import ORT, Served, age, events, run_python, serve_mlp

HEAVY = ("sqlalchemy", "sqlmodel", "alembic", "onnx", "pydantic", "mako", "pygments")


@pytest.fixture
def served(app_ctx: AppContext, tmp_path: Path) -> Served:
    return serve_mlp(app_ctx, tmp_path / "src")


def refuse_full_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, fail the test if load_or_build takes the full path."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("load_or_build took the full path")

    monkeypatch.setattr(loadpath, "load_or_build_full", refuse)


@pytest.fixture
def no_full_path(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """`served` (whose first load takes the full path), then no full path."""
    refuse_full_path(monkeypatch)


def _try(served: Served, spec: RuntimeSpec = ORT) -> object:
    return hitpath.try_hit(
        served.onnx_path, spec, home=served.app.home, db_url=served.app.db_url, host=None, started=time.perf_counter()
    )


@pytest.mark.usefixtures("no_full_path")
def test_a_hit_takes_the_hit_path_and_gives_the_same_engine(served: Served) -> None:
    loaded = load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail")
    assert loaded.via == "hitpath" and loaded.outcome == "hit"
    assert loaded.engine_id == served.engine.id and loaded.model_name == "mlp"
    import numpy as np

    assert loaded.infer({"input": np.ones((2, 16), np.float32)})["output"].shape == (2, 32)
    assert {"fingerprint", "lookup", "validity", "read_verify", "deserialize"} <= set(loaded.phases)
    order = list(loaded.phases)  # in the order they ran
    assert order.index("import_runtime") < order.index("lookup"), "the runtime is imported before the lookup"
    record = loaded.engine  # built from the row on first access
    assert record.id == served.engine.id and record.status == EngineStatus.READY
    assert record.cache_key == served.engine.cache_key and record.build_options == served.engine.build_options
    assert record.created_at == served.engine.created_at and record.created_at.tzinfo is not None
    loaded.close()


def test_a_hit_in_a_new_process_imports_no_orm_alembic_or_onnx(served: Served, installed_python: str) -> None:
    """Nor pathlib, which onnxruntime does not import either (the hit's paths are strings), nor the
    catalog's row decoding (db.reader: the hit needs db.catalogfile alone), in an interpreter started
    as a regular install starts."""
    code = (
        "import json, sys\n"
        "from enginecache import RuntimeSpec, load_or_build\n"
        f"e = load_or_build({str(served.onnx_path)!r}, spec=RuntimeSpec(backend='ort'), home={str(served.app.home)!r},"
        " on_miss='fail')\n"
        f"heavy = [m for m in {(*HEAVY, 'pathlib', 'enginecache.db.reader')!r} if m in sys.modules]\n"
        "print(json.dumps({'via': e.via, 'engine': e.engine_id, 'heavy': heavy}))\n"
    )
    result = run_python(code, python=installed_python)
    assert result == {"via": "hitpath", "engine": served.engine.id, "heavy": []}
    assert events(served.app)[-1].outcome == "hit"


@pytest.mark.usefixtures("no_full_path")
def test_the_hit_path_records_the_event_the_full_path_records(served: Served) -> None:
    load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail").close()
    full, fast = events(served.app)[-2:]
    assert (fast.outcome, fast.source, fast.reason) == ("hit", "load_or_build", f"engine {served.engine.id}")
    assert fast.stat_cache_hit is True
    for name in ("hostname", "model_name", "model_id", "engine_id", "backend", "precision", "host_target"):
        assert getattr(fast, name) == getattr(full, name), name
    for name in ("lookup_s", "read_verify_s", "load_s", "total_s"):
        assert getattr(fast, name) is not None and getattr(full, name) is not None, name
    assert fast.build_s is None and {"lookup", "read_verify", "deserialize"} <= set(fast.phases)
    assert abs(fast.created_at - datetime.now(UTC)) < timedelta(minutes=1)


def test_a_retired_engine_is_never_served(served: Served) -> None:
    retire_engine(served.app, served.engine.id or 0)
    assert _try(served) is None
    with pytest.raises(MissError):
        load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail")


def test_a_changed_onnx_file_is_not_trusted(served: Served) -> None:
    make_mlp(served.onnx_path, seed=3)  # new weights, same path
    age(served.onnx_path)
    assert _try(served) is None
    with pytest.raises(MissError, match="the file's bytes changed"):
        load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail")


def test_a_racy_stat_entry_is_not_trusted(served: Served) -> None:
    with sqlite3.connect(served.app.home / "catalog.db") as connection:
        connection.execute("UPDATE onnx_stat_cache SET racy = 1")
    assert _try(served) is None


def test_a_changed_backend_version_is_a_miss(served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ORT_BACKEND, "version", lambda: "0.0.1")
    assert _try(served) is None
    with pytest.raises(MissError) as caught:
        load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail")
    assert [d.field for d in caught.value.diffs] == ["backend_version"]


def test_another_spec_is_another_memo(served: Served) -> None:
    assert _try(served, RuntimeSpec(backend="ort", profiles=("input:1x16,4x16,8x16",))) is None


@pytest.mark.usefixtures("no_full_path")
def test_a_corrupt_blob_is_refused_and_marked_on_the_hit_path(served: Served) -> None:
    corrupt_blob(served.blob)
    with pytest.raises(EngineRejectedError) as caught:
        load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail")
    assert caught.value.verdict == "CORRUPT" and caught.value.engine_id == served.engine.id
    assert get_engine(served.app, served.engine.id or 0).status == EngineStatus.CORRUPT
    assert events(served.app)[-1].outcome == "rejected"
    assert _try(served) is None, "a CORRUPT engine changes the model's READY set"


def test_a_new_engine_of_the_model_sends_one_lookup_down_the_full_path(served: Served) -> None:
    build_engine(served.app, BuildRequest(model="mlp", backend="rtx", targets=("sm86",)))
    assert _try(served) is None
    again = load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail")
    assert again.via == "fullpath" and again.engine_id == served.engine.id
    with served.app.catalog.read() as session:
        memo = session.get(EngineMemoRecord, 1)
    assert memo is not None and memo.ready_engines == f"{served.engine.id},{served.engine.id + 1}"
    assert load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail").via == "hitpath"


# What a verdict must not import that TensorRT-RTX's own import and check do not (docs/runtime.md,
# "The import diet"): each is milliseconds of a new process's start.
# pathlib: 5-8 ms of a new process (with fnmatch, ntpath, urllib.parse, ipaddress); the hit's paths are strings.
# importlib.util: 2.5-5 ms (core.lazyimport asks the finders itself).
STDLIB_LEFT_OUT = (
    "typing",
    "threading",
    "dataclasses",
    "logging",
    "pathlib",
    "urllib.parse",
    "importlib",
    "importlib.util",
)
MODULES_JSON = "print(json.dumps(sorted(sys.modules)))\n"


@pytest.mark.usefixtures("requires_no_gpu")
def test_an_rtx_verdict_in_a_new_process_imports_no_more_stdlib_than_tensorrt_rtx(
    app_ctx: AppContext, tmp_path: Path, installed_python: str
) -> None:
    """The INCOMPATIBLE verdict's new process against the floor's (import tensorrt_rtx, a Runtime, the
    header's validity), both started as from a regular install: what the hit adds leaves out
    `STDLIB_LEFT_OUT`."""
    spec = RuntimeSpec(backend="rtx", targets=("sm86",))
    served = serve_mlp(app_ctx, tmp_path / "src", spec)
    ours = run_python(
        "import json, sys\n"
        "from enginecache import EngineRejectedError, RuntimeSpec, load_or_build\n"
        "try:\n"
        f"    load_or_build({str(served.onnx_path)!r}, spec=RuntimeSpec(backend='rtx', targets=('sm86',)),"
        f" home={str(app_ctx.home)!r}, on_miss='fail')\n"
        "except EngineRejectedError as err:\n"
        "    assert err.verdict == 'INCOMPATIBLE', err\n"
        "assert 'enginecache.service.serving.loadpath'"
        " not in sys.modules, 'the verdict took the full path'\n" + MODULES_JSON,
        python=installed_python,
    )
    blob = blob_path(app_ctx.home, served.engine.sha256)  # where the store keeps it (the hit reads it there)
    floor = run_python(
        "import json, sys\n"
        "import tensorrt_rtx as trt\n"
        "runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))\n"
        f"header = open({str(blob)!r}, 'rb').read(runtime.engine_header_size)\n"
        "runtime.get_engine_validity(header)\n" + MODULES_JSON,
        python=installed_python,
    )
    added = set(ours) - set(floor)
    assert not added & set(STDLIB_LEFT_OUT), sorted(added & set(STDLIB_LEFT_OUT))


def test_what_the_hit_path_leaves_to_the_full_path(
    served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = served.app.home
    assert catalogfile.locate(home, None) is not None
    assert catalogfile.locate(home, f"sqlite:///{home / 'catalog.db'}") is not None
    assert catalogfile.locate(home, "postgresql+psycopg://u@db/enginecache") is None
    assert catalogfile.locate(home, "sqlite:///:memory:") is None
    assert catalogfile.locate(home, f"sqlite:///{home / 'catalog.db'}?timeout=5") is None
    assert catalogfile.locate(tmp_path / "nowhere", None) is None
    calibration = tmp_path / "calib.npz"
    calibration.write_bytes(b"")
    assert _try(served, RuntimeSpec(backend="ort", calibration=calibration)) is None
    monkeypatch.setenv(hitpath.HIT_PATH_ENV, "off")
    assert _try(served) is None
    monkeypatch.delenv(hitpath.HIT_PATH_ENV)
    with sqlite3.connect(home / "catalog.db") as connection:
        connection.execute("UPDATE alembic_version SET version_num = '0001'")
    assert _try(served) is None, "another schema revision"


def test_the_hit_path_knows_the_newest_migration(app_ctx: AppContext) -> None:
    assert ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head() == head_revision()
    app_ctx.catalog.migrate()
    with sqlite3.connect(app_ctx.home / "catalog.db") as connection:
        migrated = {row[1] for row in connection.execute("PRAGMA table_info(engine_memos)")}
    assert migrated == set(EngineMemoRecord.__table__.columns.keys())


def test_old_memos_are_pruned(served: Served) -> None:
    with served.app.catalog.write() as session:
        session.exec(delete(EngineMemoRecord))  # this request's memo: gone, so the next hit writes it anew
        for i in range(40):
            session.add(
                EngineMemoRecord(
                    memo_key=f"{i:064x}",
                    model_id=served.engine.model_id,
                    engine_id=served.engine.id or 0,
                    cache_key=served.engine.cache_key,
                    ready_engines="",
                    host_target="x",
                    hostname=events(served.app)[-1].hostname,
                    created_at=datetime.now(UTC) - timedelta(days=1, minutes=i),
                )
            )
    assert load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail").via == "fullpath"
    with served.app.catalog.read() as session:
        kept = list(session.exec(select(EngineMemoRecord)).all())
    assert len(kept) == loadpath.MEMOS_PER_MODEL_AND_HOST
    assert load_or_build(served.onnx_path, spec=ORT, app=served.app, on_miss="fail").via == "hitpath"


def test_the_hit_path_finds_the_catalog_where_the_full_path_opens_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enginecache.service import context

    theirs = (context.HOME_ENV, context.DB_URL_ENV, str(context.DEFAULT_HOME))
    assert theirs == (catalogfile.HOME_ENV, catalogfile.DB_URL_ENV, catalogfile.DEFAULT_HOME)
    monkeypatch.setenv(context.HOME_ENV, str(tmp_path / "home"))
    monkeypatch.delenv(context.DB_URL_ENV, raising=False)
    app = AppContext.from_settings()
    assert catalogfile.locate(None, None) is None, "no catalog yet: the full path creates it"
    app.catalog.migrate()
    found = catalogfile.locate(None, None)
    assert found is not None and found.home == str(app.home) and app.db_url == f"sqlite:///{found.path}"
    app.close()
