"""A disk budget (core.diskbudget) on a pulled folder (`pull --max-bytes`) and on the store's local cache
(`ENGINECACHE_STORE_CACHE_MAX_BYTES`): the least recently loaded blobs go first (never-loaded ones by
when they landed), a blob a live process has loaded survives (a real second process holds it), a blob
a manifest names or whose only copy is here is never evicted, and a budget smaller than the engine is
a clear error before anything is copied or removed. Times are explicit atime/mtime values."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.core.backends.base import PhaseTimer
from enginecache.core.blobpaths import blob_path
from enginecache.core.diskbudget import (
    STORE_CACHE_ENV,
    BlobHold,
    evict,
    folder_lock,
    parse_size,
)
from enginecache.db.models import EngineRecord
from enginecache.errors import BadInputError, StoreError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.profiles import Wanted
from enginecache.service.fleet.pull import manifest_path, pull
from enginecache.service.models.register import register_model
from enginecache.service.serving.engineload import EngineFacts, load_engine
from enginecache.service.serving.runtime import load_or_build
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp
from tests.servingkit import ROOT

S = 1_000_000_000  # ns in a second: explicit times below are in seconds


def _blob(root: Path, data: bytes, *, pulled_at: int, used_at: int | None = None) -> str:
    """A blob under `root` laid out as the store lays it out; mtime when it landed, atime when last used."""
    digest = hashlib.sha256(data).hexdigest()
    path = blob_path(root, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=((used_at if used_at is not None else pulled_at) * S, pulled_at * S))
    return digest


def _manifest(root: Path, name: str, digest: str) -> None:
    folder = root / "manifests"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"engine": {"sha256": digest}}))


def _evict(
    root: Path, max_bytes: int, *, incoming: int = 0, keep: frozenset[str] = frozenset()
) -> tuple[list[str], list[str]]:
    with folder_lock(str(root), exclusive=True):
        report = evict(str(root), max_bytes, incoming=incoming, keep=keep)
    return [digest for digest, _size in report.evicted], report.in_use


def _present(root: Path, digest: str) -> bool:
    return blob_path(root, digest).is_file()


def test_eviction_takes_the_least_recently_loaded_first_and_never_a_named_or_kept_blob(tmp_path: Path) -> None:
    root = tmp_path / "pulled"
    never_loaded_old = _blob(root, b"a" * 100, pulled_at=1000)
    loaded_late = _blob(root, b"b" * 100, pulled_at=2000, used_at=5000)
    never_loaded_newer = _blob(root, b"c" * 100, pulled_at=3000)
    named = _blob(root, b"d" * 100, pulled_at=500)  # the oldest of all, but a manifest names it
    kept = _blob(root, b"e" * 100, pulled_at=4000)
    _manifest(root, "other", named)
    (root / "manifests" / "broken.json").write_text("{not json")  # names nothing a load could use
    (root / "manifests" / ".other.json.tmp1234").write_text("{}")  # a manifest being written

    evicted, in_use = _evict(root, 300, keep=frozenset({kept}))
    assert evicted == [never_loaded_old, never_loaded_newer], "oldest use first; it stops once 300 bytes fit"
    assert in_use == [] and _present(root, loaded_late) and _present(root, named) and _present(root, kept)

    evicted, _ = _evict(root, 300, incoming=100, keep=frozenset({kept}))
    assert evicted == [loaded_late], "room made for 100 incoming bytes; the named and the kept blobs stay"
    assert _present(root, named) and _present(root, kept)


def test_a_load_records_its_use_in_the_atime_and_keeps_the_mtime(tmp_path: Path) -> None:
    root = tmp_path / "pulled"
    first = _blob(root, b"x" * 100, pulled_at=1000)
    second = _blob(root, b"y" * 100, pulled_at=2000)
    hold = BlobHold()
    assert hold.take(str(blob_path(root, first)), now_ns=3000 * S) and hold.held
    hold.close()
    st = blob_path(root, first).stat()
    assert (st.st_atime_ns, st.st_mtime_ns) == (3000 * S, 1000 * S), "a serving state compares the mtime"
    evicted, _ = _evict(root, 100)
    assert evicted == [second], "the blob loaded at 3000 is now the most recently used"
    assert not BlobHold().take(str(blob_path(root, second))), "an evicted blob is not there to hold"


def _holder(path: Path) -> subprocess.Popen[str]:
    """A second process that holds `path` as a loaded engine does, until its stdin closes."""
    code = (
        "import sys\nfrom enginecache.core.diskbudget import BlobHold\n"
        "hold = BlobHold()\nassert hold.take(sys.argv[1])\nprint('held', flush=True)\nsys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "held"
    return child


def _release(child: subprocess.Popen[str]) -> None:
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(timeout=60) == 0


def test_a_blob_a_live_process_holds_survives_and_goes_once_it_is_released(tmp_path: Path) -> None:
    root = tmp_path / "pulled"
    held = _blob(root, b"h" * 100, pulled_at=1000)
    free = _blob(root, b"f" * 100, pulled_at=2000)
    child = _holder(blob_path(root, held))
    try:
        with folder_lock(str(root), exclusive=True):
            report = evict(str(root), 50)
        assert report.in_use == [held] and [d for d, _ in report.evicted] == [free]
        assert report.over_budget and report.total_after == 100 and _present(root, held)
    finally:
        _release(child)
    evicted, in_use = _evict(root, 50)
    assert evicted == [held] and in_use == []


def test_sizes_and_their_errors() -> None:
    assert parse_size("20G", "--max-bytes") == 20 << 30 and parse_size(" 512 ", "x") == 512
    assert parse_size("3k", "x") == 3 << 10
    for bad in ("0", "-1", "1.5G", "lots", "", "G"):
        with pytest.raises(BadInputError, match="--max-bytes"):
            parse_size(bad, "--max-bytes")


# -- pull --max-bytes, with real engines -------------------------------------------------------


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[AppContext, dict[str, EngineRecord]]]:
    """One catalog for the module: model `mlp` with an fp32 and an fp16 ONNX Runtime engine."""
    root = tmp_path_factory.mktemp("disk-budget")
    app = AppContext.from_settings(root / "home")
    try:
        register_model(app, make_mlp(root / "mlp.onnx"), name="mlp")
        engines = {
            p: build_engine(app, BuildRequest(model="mlp", backend="ort", precision=p)).engine for p in ("fp32", "fp16")
        }
        yield app, engines
    finally:
        app.close()


def _size(engine: EngineRecord) -> int:
    return int(engine.size_bytes or 0)


def test_pull_evicts_the_engine_it_replaced_but_not_while_a_serving_process_has_it_loaded(
    catalog: tuple[AppContext, dict[str, EngineRecord]], tmp_path: Path
) -> None:
    app, engines = catalog
    old, new = engines["fp32"], engines["fp16"]
    dest = tmp_path / "engines"
    pull(app, "mlp", dest, wanted=Wanted(precision="fp32"))
    old_blob = blob_path(dest, old.sha256)
    os.utime(old_blob, ns=(1000 * S, 1000 * S))  # pulled and last used long ago
    manifest = manifest_path(dest, "mlp")
    code = (
        "import sys\nfrom enginecache import load_or_build\n"
        "engine = load_or_build(sys.argv[1], spec=None)\nprint(engine.via, flush=True)\nsys.stdin.read()\n"
        "engine.close()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINECACHE_DB_URL", "ENGINECACHE_HOME")}
    serving = subprocess.Popen(
        [sys.executable, "-c", code, str(manifest)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=env,
    )
    budget = _size(old) + _size(new) - 1  # not both
    try:
        assert serving.stdout is not None and serving.stdout.readline().strip() == "pulled"
        st = old_blob.stat()
        assert st.st_atime_ns > 1000 * S and st.st_mtime_ns == 1000 * S, "load_or_build recorded its use"
        upgraded = pull(app, "mlp", dest, max_bytes=budget)  # the manifest now names fp16
        assert upgraded.engine_id == new.id and upgraded.evicted is not None
        assert upgraded.evicted.in_use == [old.sha256] and upgraded.evicted.evicted == []
        assert upgraded.evicted.over_budget and old_blob.is_file(), "a live process's engine survives"
    finally:
        _release(serving)
    again = pull(app, "mlp", dest, max_bytes=budget)
    assert again.up_to_date and again.evicted is not None
    assert again.evicted.evicted == [(old.sha256, _size(old))] and not again.evicted.over_budget
    assert not old_blob.exists() and blob_path(dest, new.sha256).is_file()
    with load_or_build(manifest, spec=None) as engine:  # no manifest names a missing blob
        assert engine.engine_id == new.id


def _cli(app: AppContext, *args: str) -> list[str]:
    return ["--home", str(app.home), "--db", app.db_url, *args]


def test_the_cli_reports_evictions_and_refuses_a_budget_smaller_than_the_engine(
    catalog: tuple[AppContext, dict[str, EngineRecord]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app, engines = catalog
    old, new = engines["fp32"], engines["fp16"]
    dest = tmp_path / "engines"
    pull(app, "mlp", dest, wanted=Wanted(precision="fp32"))  # left unnamed once the next pull takes fp16
    too_small = run_cli(capsys, *_cli(app, "pull", "mlp", "--dest", str(dest), "--max-bytes", "10", "--json"))
    assert too_small.code == 2, too_small.err
    error = too_small.json()  # exactly one JSON document, also on failure
    assert error["kind"] == "bad_input" and error["exit_code"] == 2
    assert "--max-bytes 10" in error["error"] and f"{_size(new)} bytes" in error["error"]
    assert blob_path(dest, old.sha256).is_file() and not blob_path(dest, new.sha256).exists(), "nothing moved"
    assert json.loads(manifest_path(dest, "mlp").read_text())["engine"]["id"] == old.id

    _manifest(dest, "other", str(old.sha256))  # another model's manifest names the fp32 blob: it must stay
    both = run_cli(capsys, *_cli(app, "pull", "mlp", "--dest", str(dest), "--max-bytes", str(_size(new)), "--json"))
    assert both.code == 2 and f"{_size(old)} bytes that must stay" in both.json()["error"]
    (dest / "manifests" / "other.json").unlink()

    bad = run_cli(capsys, *_cli(app, "pull", "mlp", "--dest", str(dest), "--max-bytes", "lots"))
    assert bad.code == 2 and "--max-bytes='lots' is not a size" in bad.err

    done = run_cli(capsys, *_cli(app, "pull", "mlp", "--dest", str(dest), "--max-bytes", str(_size(new)), "--json"))
    assert done.code == 0, done.err
    data = done.json()
    assert data["engine_id"] == new.id and data["copied_bytes"] == _size(new)
    assert data["evicted"] == {
        "max_bytes": _size(new),
        "bytes": _size(old),
        "blobs": [{"sha256": old.sha256, "bytes": _size(old)}],
        "in_use": [],
        "total_bytes": _size(new),
        "over_budget": False,
    }
    assert not blob_path(dest, old.sha256).exists(), "room was made before the copy"
    text = run_cli(capsys, *_cli(app, "pull", "mlp", "--dest", str(dest), "--max-bytes", "1G"))
    assert text.code == 0 and "up to date" in text.out and "evicted 0 blob(s)" in text.out


# -- the store's local cache, with a real S3 server ----------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[object]:
    from tests.s3kit import running_server

    with running_server() as started:
        yield started


def test_the_store_cache_keeps_its_budget_and_never_evicts_a_blob_only_it_holds(
    catalog: tuple[AppContext, dict[str, EngineRecord]],
    server: object,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from enginecache.core.objectstore import S3BlobStore
    from enginecache.core.storeconfig import s3_settings
    from tests.s3kit import S3Server, use_env

    assert isinstance(server, S3Server)
    app, engines = catalog
    fp32, fp16 = engines["fp32"], engines["fp16"]
    use_env(monkeypatch, server.env(f"cache-{uuid.uuid4().hex[:12]}"))
    settings = s3_settings()
    assert settings is not None
    remote = S3BlobStore(settings)
    for engine in (fp32, fp16):
        remote.put_blob(str(engine.sha256), blob_path(app.home, engine.sha256), _size(engine))
    home = tmp_path / "serving-host"  # this host's cache of the store: empty but for a blob only it has
    only_here = _blob(home, os.urandom(1000), pulled_at=1000)
    monkeypatch.setenv(STORE_CACHE_ENV, str(max(_size(fp32), _size(fp16)) + 1000))  # one engine at a time

    def facts(engine: EngineRecord) -> EngineFacts:
        return EngineFacts.from_row(home, {**engine.model_dump(), "build_options": engine.build_options})

    load_engine(facts(fp32), PhaseTimer(), on_corrupt=pytest.fail).close()  # fetched: fits beside the local one
    assert _present(home, str(fp32.sha256)) and _present(home, only_here)
    os.utime(blob_path(home, fp32.sha256), ns=(2000 * S, 2000 * S))  # used after the local blob landed
    load_engine(facts(fp16), PhaseTimer(), on_corrupt=pytest.fail).close()
    assert _present(home, str(fp16.sha256)), "fetched"
    assert not _present(home, str(fp32.sha256)), "evicted: the remote holds it, a load fetches it again"
    assert _present(home, only_here), "the least recently used, but its only copy is here"

    monkeypatch.setenv(STORE_CACHE_ENV, "10")
    with pytest.raises(StoreError, match=rf"{STORE_CACHE_ENV} 10 is smaller .* {_size(fp32)} bytes\)"):
        load_engine(facts(fp32), PhaseTimer(), on_corrupt=pytest.fail)
    assert not _present(home, str(fp32.sha256)) and _present(home, str(fp16.sha256)), "nothing moved"
