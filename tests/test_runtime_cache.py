"""TensorRT-RTX runtime caches: the reuse rule (core.runtimecache), pinned by a table.

Each row is a cache's key and a host's; the rule either hands the cache over or refuses it, and
`select` never returns a refused one.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from enginecache.core.backends.loadtypes import LoadSpec, PhaseTimer
from enginecache.core.backends.registry import get_backend
from enginecache.core.backends.trt.runtimecache import create_context, serialized_cache, supports_runtime_cache
from enginecache.core.fingerprint import host_fingerprint
from enginecache.core.gpufacts import GpuInfo
from enginecache.core.hostfingerprint import HostFingerprint
from enginecache.core.runtimecache import CacheTarget, host_target, normalize_sm, parse_version, refusal, select
from enginecache.db.catalogfile import locate
from enginecache.db.models import EngineRecord, ModelRecord
from enginecache.errors import BadInputError, IntegrityCheckError, LoadFailedError, NotFoundError
from enginecache.service.access import audit
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.profiles import Wanted
from enginecache.service.fleet.pull import pull
from enginecache.service.fleet.runtimecaches import (
    RUNTIME_CACHE_PUBLISH,
    best_for_host,
    fetch_runtime_cache,
    list_runtime_caches,
    publish_runtime_cache,
    publish_session_cache,
)
from enginecache.service.maintenance.backup.create import backup
from enginecache.service.maintenance.gc.references import read_references
from enginecache.service.maintenance.gc.report import GcPolicy
from enginecache.service.models.register import register_model
from enginecache.service.serving.engineload import load_engine
from enginecache.service.serving.hitpath import runtime_cache_rows
from enginecache.service.serving.loading import engine_facts
from enginecache.service.serving.runtimecache import for_catalog_engine, for_hit, for_pulled
from tests.clirunner import run_cli
from tests.dashboardkit import served_catalog, view
from tests.enginerows import engine_row_like
from tests.modelfactory import make_mlp

ENGINE = "a" * 64
OTHER_ENGINE = "b" * 64


def key(
    *,
    sku: str = "NVIDIA GeForce RTX 4090",
    sm: str = "sm89",
    rtx: str = "1.7.1",
    cuda: str = "12.9",
    engine: str = ENGINE,
) -> CacheTarget:
    return CacheTarget(engine, sku, sm, rtx, cuda)


HOST = key()

# (row name, cache key, host, handed over, words the refusal must contain)
TABLE = [
    ("same SKU", key(), HOST, True, ""),
    ("same SKU, name spelled otherwise", key(sku="nvidia  geforce rtx 4090"), HOST, True, ""),
    ("same SM, newer RTX on the host", key(sku="NVIDIA RTX 4000 Ada", rtx="1.6.0"), HOST, True, ""),
    ("same SM as 8.9", key(sm="8.9"), HOST, True, ""),
    ("same SM, newer CUDA minor on the host", key(cuda="12.4"), HOST, True, ""),
    ("older RTX on the host refused", key(rtx="1.8.0"), HOST, False, "newer than this host's 1.7.1"),
    ("other SM refused", key(sku="NVIDIA GeForce RTX 3090", sm="sm86"), HOST, False, "written on sm86"),
    ("other SM, same name refused", key(sm="sm86"), HOST, False, "this GPU is sm89"),
    ("older CUDA on the host refused", key(cuda="12.10"), HOST, False, "newer than this host's 12.9"),
    ("other CUDA major refused", key(cuda="11.8"), HOST, False, "another major version"),
    ("other engine refused", key(engine=OTHER_ENGINE), HOST, False, "written for engine"),
    ("unreadable RTX version refused", key(rtx="1.7-beta"), HOST, False, "not readable"),
    ("unreadable compute capability refused", key(sm="ampere"), HOST, False, "not readable"),
]


@pytest.mark.parametrize(
    ("cache", "host", "handed_over", "words"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_reuse_rule_table(cache: CacheTarget, host: CacheTarget, handed_over: bool, words: str) -> None:
    reason = refusal(cache, host)
    chosen = select([cache], host)
    if handed_over:
        assert reason is None
        assert chosen is cache
    else:
        assert reason is not None and words in reason
        assert chosen is None


def test_exact_sku_preferred_over_same_sm() -> None:
    same_sm = key(sku="NVIDIA RTX 4000 Ada", rtx="1.7.1")
    exact = key(rtx="1.6.0")
    assert select([same_sm, exact], HOST) is exact
    assert select([exact, same_sm], HOST) is exact


def test_closest_rtx_then_cuda_version_preferred() -> None:
    old = key(rtx="1.5.0", cuda="12.9")
    close = key(rtx="1.7.1", cuda="12.4")
    closest = key(rtx="1.7.1", cuda="12.8")
    too_new = key(rtx="1.8.0", cuda="12.9")
    assert select([old, close, closest, too_new], HOST) is closest


def test_select_never_returns_a_refused_cache() -> None:
    refused = [key(rtx="2.0"), key(sm="sm90"), key(cuda="13.0"), key(engine=OTHER_ENGINE)]
    assert select(refused, HOST) is None
    assert select([], HOST) is None


def test_ties_keep_the_first_given() -> None:
    first, second = key(), key()
    assert select([first, second], HOST) is first


@pytest.mark.parametrize(
    ("text", "expected"), [("sm86", "sm86"), ("sm_86", "sm86"), ("86", "sm86"), ("8.6", "sm86"), ("x", None)]
)
def test_compute_capability_spellings(text: str, expected: str | None) -> None:
    assert normalize_sm(text) == expected


def test_versions_are_dotted_integers_only() -> None:
    assert parse_version("12.9") == (12, 9)
    assert parse_version("1.7.1.116") == (1, 7, 1, 116)
    assert parse_version("12.9rc1") is None
    assert parse_version("") is None


# -- the hand-over to TensorRT-RTX's runtime ----------------------------------------------------
# No RTX GPU here: these objects stand in for TensorRT-RTX's ICudaEngine / IRuntimeConfig /
# IRuntimeCache, recording the documented calls, and the cache bytes are opaque stand-ins.


class StandInRtxRuntimeCache:
    def __init__(self, accepts: bool) -> None:
        self.accepts = accepts
        self.received: bytes | None = None
        self.entries = b""

    def deserialize(self, blob: bytes) -> bool:
        self.received = bytes(blob)
        if self.accepts:
            self.entries = bytes(blob)
        return self.accepts

    def serialize(self) -> memoryview:
        return memoryview(self.entries + b"+compiled")


class StandInRtxRuntimeConfig:
    def __init__(self, accepts: bool) -> None:
        self.accepts = accepts
        self.attached: StandInRtxRuntimeCache | None = None

    def create_runtime_cache(self) -> StandInRtxRuntimeCache:
        return StandInRtxRuntimeCache(self.accepts)

    def set_runtime_cache(self, cache: StandInRtxRuntimeCache) -> bool:
        self.attached = cache
        return True

    def get_runtime_cache(self) -> StandInRtxRuntimeCache | None:
        return self.attached


class StandInRtxEngine:
    def __init__(self, accepts: bool = True) -> None:
        self.config = StandInRtxRuntimeConfig(accepts)
        self.context_config: object = None

    def create_runtime_config(self) -> StandInRtxRuntimeConfig:
        return self.config

    def create_execution_context(self, runtime_config: object = None) -> str:
        self.context_config = runtime_config
        return "context"


def test_cache_file_handed_to_stand_in_for_tensorrt_rtx_runtime(tmp_path: Path) -> None:
    stand_in_cache = tmp_path / "stand-in-runtime-cache.bin"
    stand_in_cache.write_bytes(b"opaque stand-in for a TensorRT-RTX runtime cache")
    engine = StandInRtxEngine()
    assert supports_runtime_cache(engine)
    context, hand_over = create_context(engine, str(stand_in_cache))
    assert context == "context"
    assert engine.context_config is engine.config  # the context runs with the config that holds the cache
    attached = engine.config.attached
    assert attached is not None and attached.received == stand_in_cache.read_bytes()
    assert hand_over.loaded and hand_over.path == str(stand_in_cache)
    assert serialized_cache(hand_over) == stand_in_cache.read_bytes() + b"+compiled"


def test_cache_refused_by_stand_in_for_tensorrt_rtx_runtime_is_no_error(tmp_path: Path) -> None:
    stand_in_cache = tmp_path / "stand-in-runtime-cache.bin"
    stand_in_cache.write_bytes(b"opaque stand-in the runtime refuses")
    engine = StandInRtxEngine(accepts=False)
    _, hand_over = create_context(engine, str(stand_in_cache))
    assert not hand_over.loaded
    assert engine.config.attached is not None  # an empty cache, filled by this process's compiles
    assert serialized_cache(hand_over) == b"+compiled"


def test_no_cache_file_gives_an_empty_cache_to_stand_in_for_tensorrt_rtx_runtime() -> None:
    engine = StandInRtxEngine()
    _, hand_over = create_context(engine, None)
    assert not hand_over.loaded and engine.config.attached is not None
    assert engine.config.attached.received is None


def test_unreadable_cache_file_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "missing-stand-in-cache.bin"
    with pytest.raises(LoadFailedError, match=r"missing-stand-in-cache\.bin"):
        create_context(StandInRtxEngine(), str(missing))


def test_plain_tensorrt_engine_has_no_runtime_cache() -> None:
    class PlainTensorRTEngine:
        def create_execution_context(self) -> str:
            return "context"

    assert not supports_runtime_cache(PlainTensorRTEngine())


# -- publish, list, choose, fetch (service.fleet.runtimecaches), on a real catalog and store -------


def _rtx_engine_row(app: AppContext, backend: str = "rtx") -> EngineRecord:
    with app.catalog.write() as session:
        model = ModelRecord(name="m", digest="c" * 64, filename="m.onnx", store_path="x", size_bytes=1)
        session.add(model)
        session.flush()
        engine = EngineRecord(
            model_id=model.id or 0,
            cache_key="e" * 64,
            backend=backend,
            backend_version="1.7.1.116",
            precision="fp16",
            targets="sm89",
            status="READY",
            onnx_digest="d",
            os="Linux",
            sha256=ENGINE,
        )
        session.add(engine)
        session.flush()
        session.refresh(engine)
        session.expunge(engine)
    return engine


def _stand_in_cache(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / f"stand-in-runtime-cache-{name}.bin"
    path.write_bytes(b"opaque stand-in for a TensorRT-RTX runtime cache: " + content)
    return path


def test_publish_list_choose_and_fetch_a_stand_in_cache(catalog_ctx: AppContext, tmp_path: Path) -> None:
    engine = _rtx_engine_row(catalog_ctx)
    engine_id = engine.id or 0
    ada = _stand_in_cache(tmp_path, "ada-4000", b"ada")
    rtx4090 = _stand_in_cache(tmp_path, "4090", b"4090")
    newer = _stand_in_cache(tmp_path, "4090-rtx-1.8", b"4090 newer")
    common = {"compute_capability": "8.9", "cuda_version": "12.9"}
    same_sm = publish_runtime_cache(
        catalog_ctx, engine_id, ada, gpu_sku="NVIDIA RTX 4000 Ada", rtx_version="1.7.1", **common
    )
    exact = publish_runtime_cache(
        catalog_ctx, engine_id, rtx4090, gpu_sku="NVIDIA GeForce RTX 4090", rtx_version="1.6.0", **common
    )
    too_new = publish_runtime_cache(
        catalog_ctx, engine_id, newer, gpu_sku="NVIDIA GeForce RTX 4090", rtx_version="1.8.0", **common
    )
    assert exact.compute_capability == "sm89" and exact.engine_sha256 == ENGINE
    again = publish_runtime_cache(
        catalog_ctx, engine_id, rtx4090, gpu_sku="NVIDIA GeForce RTX 4090", rtx_version="1.6.0", **common
    )
    assert again.id == exact.id  # the same bytes under the same key: no second row
    listed = list_runtime_caches(catalog_ctx, engine_id)
    assert {c.id for c in listed} == {same_sm.id, exact.id, too_new.id}
    events = audit.list_audit(catalog_ctx, action=RUNTIME_CACHE_PUBLISH)
    assert len(events) == 3 and events[0].target == f"engine {engine_id}"

    best = best_for_host(catalog_ctx, engine_id, HOST)
    assert best is not None and best.id == exact.id
    fetched = fetch_runtime_cache(catalog_ctx, best)
    assert fetched.read_bytes() == rtx4090.read_bytes()
    other_sm = key(sku="NVIDIA GeForce RTX 3090", sm="sm86")
    assert best_for_host(catalog_ctx, engine_id, other_sm) is None
    assert best_for_host(catalog_ctx, engine_id, None) is None


def test_publish_refuses_bad_input_and_stores_nothing(catalog_ctx: AppContext, tmp_path: Path) -> None:
    engine = _rtx_engine_row(catalog_ctx)
    good = _stand_in_cache(tmp_path, "good", b"x")
    fields = {"gpu_sku": "NVIDIA GeForce RTX 4090", "compute_capability": "sm89", "cuda_version": "12.9"}
    with pytest.raises(BadInputError, match=r"TensorRT-RTX version '1\.7-beta'"):
        publish_runtime_cache(catalog_ctx, engine.id or 0, good, rtx_version="1.7-beta", **fields)
    empty = tmp_path / "stand-in-empty.bin"
    empty.write_bytes(b"")
    with pytest.raises(BadInputError, match="is empty"):
        publish_runtime_cache(catalog_ctx, engine.id or 0, empty, rtx_version="1.7.1", **fields)
    with pytest.raises(NotFoundError, match="no engine with id 999"):
        publish_runtime_cache(catalog_ctx, 999, good, rtx_version="1.7.1", **fields)
    assert list_runtime_caches(catalog_ctx) == []
    assert not any(catalog_ctx.store.objects_dir.rglob("*"))


def test_publish_refuses_a_plain_tensorrt_engine(catalog_ctx: AppContext, tmp_path: Path) -> None:
    engine = _rtx_engine_row(catalog_ctx, backend="trt")
    with pytest.raises(BadInputError, match="runtime caches are TensorRT-RTX's"):
        publish_runtime_cache(
            catalog_ctx,
            engine.id or 0,
            _stand_in_cache(tmp_path, "trt", b"x"),
            gpu_sku="G",
            compute_capability="sm89",
            rtx_version="1.7.1",
            cuda_version="12.9",
        )


def test_a_damaged_stand_in_cache_blob_is_not_handed_over(catalog_ctx: AppContext, tmp_path: Path) -> None:
    engine = _rtx_engine_row(catalog_ctx)
    row = publish_runtime_cache(
        catalog_ctx,
        engine.id or 0,
        _stand_in_cache(tmp_path, "damaged", b"y"),
        gpu_sku="NVIDIA GeForce RTX 4090",
        compute_capability="sm89",
        rtx_version="1.7.1",
        cuda_version="12.9",
    )
    blob = catalog_ctx.store.blob_path(row.sha256)
    blob.chmod(0o644)
    blob.write_bytes(b"changed")
    with pytest.raises(IntegrityCheckError, match="sha256"):
        fetch_runtime_cache(catalog_ctx, row)


def test_cli_publishes_and_lists_a_stand_in_cache(
    app_factory: Callable[..., AppContext], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = app_factory()
    engine = _rtx_engine_row(app)
    stand_in = _stand_in_cache(tmp_path, "cli", b"z")
    where = ("--home", str(app.home), "--db", app.db_url)
    published = run_cli(
        capsys,
        *where,
        "runtime-cache",
        "publish",
        str(engine.id),
        str(stand_in),
        "--gpu",
        "NVIDIA GeForce RTX 4090",
        "--cc",
        "sm89",
        "--rtx-version",
        "1.7.1",
        "--cuda-version",
        "12.9",
        "--json",
    )
    assert published.code == 0, published.err
    assert published.json()["gpu_sku"] == "NVIDIA GeForce RTX 4090"
    listed = run_cli(capsys, *where, "runtime-cache", "list", "--engine", str(engine.id))
    assert listed.code == 0 and "NVIDIA GeForce RTX 4090 (sm89)" in listed.out
    refused = run_cli(capsys, *where, "runtime-cache", "publish", str(engine.id), str(stand_in), "--cc", "ampere")
    assert refused.code == 2


def test_gc_keeps_a_published_stand_in_cache_blob(catalog_ctx: AppContext, tmp_path: Path) -> None:
    engine = _rtx_engine_row(catalog_ctx)
    row = publish_runtime_cache(
        catalog_ctx,
        engine.id or 0,
        _stand_in_cache(tmp_path, "gc", b"kept"),
        gpu_sku="NVIDIA GeForce RTX 4090",
        compute_capability="sm89",
        rtx_version="1.7.1",
        cuda_version="12.9",
    )
    references = read_references(catalog_ctx, datetime.now(UTC), GcPolicy())
    assert row.sha256 in references.blobs


# -- pull: the best cache lands in DEST and the manifest names it ------------------------------------


def _rtx_host(rtx_version: str) -> HostFingerprint:
    """This host's fingerprint with an RTX 4090 (sm89) and TensorRT-RTX `rtx_version`: a test-only host."""
    gpu = GpuInfo(
        index=0, name="NVIDIA GeForce RTX 4090", uuid="GPU-t", compute_capability="sm89", memory_total_bytes=1
    )
    here = host_fingerprint()
    return here.replace(
        gpus=(gpu,), cuda_driver_version="12.9", packages={**here.packages, "tensorrt_rtx": rtx_version}
    )


@pytest.fixture
def pulled_rtx_engine(app_ctx: AppContext, tmp_path: Path) -> EngineRecord:
    import tensorrt_rtx

    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    built = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    return engine_row_like(app_ctx, built, backend="rtx", backend_version=tensorrt_rtx.__version__, targets="sm89")


def test_pull_lands_the_best_stand_in_cache_and_names_it(
    app_ctx: AppContext, pulled_rtx_engine: EngineRecord, tmp_path: Path
) -> None:
    import tensorrt_rtx

    engine_id = pulled_rtx_engine.id or 0
    fields = {"compute_capability": "sm89", "cuda_version": "12.9", "rtx_version": tensorrt_rtx.__version__}
    publish_runtime_cache(
        app_ctx, engine_id, _stand_in_cache(tmp_path, "same-sm", b"ada"), gpu_sku="NVIDIA RTX 4000 Ada", **fields
    )
    exact_file = _stand_in_cache(tmp_path, "exact", b"4090")
    exact = publish_runtime_cache(app_ctx, engine_id, exact_file, gpu_sku="NVIDIA GeForce RTX 4090", **fields)
    dest = tmp_path / "pulled"
    result = pull(app_ctx, "mlp", dest, wanted=Wanted(backend="rtx"), host=_rtx_host(tensorrt_rtx.__version__))
    entry = result.manifest["runtime_cache"]
    assert entry["id"] == exact.id and entry["gpu_sku"] == "NVIDIA GeForce RTX 4090"
    assert (dest / entry["blob"]).read_bytes() == exact_file.read_bytes()
    assert json.loads(result.manifest_path.read_text())["runtime_cache"]["sha256"] == exact.sha256


def test_pull_names_no_stand_in_cache_the_rule_refuses(
    app_ctx: AppContext, pulled_rtx_engine: EngineRecord, tmp_path: Path
) -> None:
    publish_runtime_cache(
        app_ctx,
        pulled_rtx_engine.id or 0,
        _stand_in_cache(tmp_path, "newer-rtx", b"newer"),
        gpu_sku="NVIDIA GeForce RTX 4090",
        compute_capability="sm89",
        cuda_version="12.9",
        rtx_version="99.0",  # written by a TensorRT-RTX newer than the host's
    )
    dest = tmp_path / "pulled"
    result = pull(app_ctx, "mlp", dest, wanted=Wanted(backend="rtx"), host=_rtx_host("1.7.1.116"))
    assert "runtime_cache" not in result.manifest
    assert [p.name for p in (dest / "objects").rglob("*") if p.is_file()] == [result.sha256]


# -- serving: which cache file a load hands to the runtime ------------------------------------------


def test_the_hit_path_chooses_the_stand_in_cache_the_full_path_chooses(app_ctx: AppContext, tmp_path: Path) -> None:
    """The stdlib hit path (no ORM) reads the engine's caches on its own connection and applies the
    same rule and checks: the exact SKU over the same SM, nothing for another SM, nothing for damaged
    bytes. (Opaque stand-ins: producing a real cache needs an RTX GPU.)"""
    engine = _rtx_engine_row(app_ctx)
    common = {"compute_capability": "8.9", "cuda_version": "12.9"}
    for name, sku, rtx in (("ada", "NVIDIA RTX 4000 Ada", "1.7.1"), ("4090", "NVIDIA GeForce RTX 4090", "1.6.0")):
        path = _stand_in_cache(tmp_path, name, name.encode())
        publish_runtime_cache(app_ctx, engine.id or 0, path, gpu_sku=sku, rtx_version=rtx, **common)
    where = locate(app_ctx.home, app_ctx.db_url)
    assert where is not None
    with contextlib.closing(sqlite3.connect(where.path)) as connection:
        rows = runtime_cache_rows(connection, engine.id or 0)
    assert len(rows) == 2
    handed = for_hit(str(app_ctx.home), rows, HOST)
    assert handed is not None and handed == for_catalog_engine(app_ctx, engine, host=HOST)
    assert Path(handed).read_bytes() == _stand_in_cache(tmp_path, "4090", b"4090").read_bytes()
    assert for_hit(str(app_ctx.home), rows, key(sku="NVIDIA GeForce RTX 3090", sm="sm86")) is None
    assert for_hit(str(app_ctx.home), rows, None) is None, "a host with no GPU or RTX gets none"
    Path(handed).chmod(0o644)
    Path(handed).write_bytes(b"damaged stand-in")
    assert for_hit(str(app_ctx.home), rows, HOST) is None


def test_serving_hands_over_the_pulled_stand_in_cache_only_where_the_rule_allows(
    app_ctx: AppContext, pulled_rtx_engine: EngineRecord, tmp_path: Path
) -> None:
    import tensorrt_rtx

    version = tensorrt_rtx.__version__
    stand_in = _stand_in_cache(tmp_path, "served", b"served")
    publish_runtime_cache(
        app_ctx,
        pulled_rtx_engine.id or 0,
        stand_in,
        gpu_sku="NVIDIA GeForce RTX 4090",
        compute_capability="sm89",
        cuda_version="12.9",
        rtx_version=version,
    )
    dest = tmp_path / "pulled"
    manifest = pull(app_ctx, "mlp", dest, wanted=Wanted(backend="rtx"), host=_rtx_host(version)).manifest
    sha = str(pulled_rtx_engine.sha256)
    here = CacheTarget(sha, "NVIDIA GeForce RTX 4090", "sm89", version, "12.9")
    handed = for_pulled(dest, manifest, host=here)
    assert handed is not None and Path(handed).read_bytes() == stand_in.read_bytes()
    assert for_pulled(dest, manifest, host=CacheTarget(sha, "NVIDIA GeForce RTX 3090", "sm86", version, "12.9")) is None
    assert for_pulled(dest, manifest, host=CacheTarget(sha, "NVIDIA GeForce RTX 4090", "sm89", version, "12.2")) is None
    catalog_path = for_catalog_engine(app_ctx, pulled_rtx_engine, host=here)
    assert catalog_path is not None and Path(catalog_path).read_bytes() == stand_in.read_bytes()
    assert for_catalog_engine(app_ctx, pulled_rtx_engine, host=CacheTarget(sha, "G", "sm90", version, "12.9")) is None
    landed = dest / manifest["runtime_cache"]["blob"]
    landed.chmod(0o644)
    landed.write_bytes(b"damaged stand-in")
    assert for_pulled(dest, manifest, host=here) is None  # bytes that are not the cache: never handed over


def test_host_target_reads_gpu_rtx_and_cuda_from_a_fingerprint() -> None:
    target = host_target(ENGINE, _rtx_host("1.7.1.116"))
    assert target == CacheTarget(ENGINE, "NVIDIA GeForce RTX 4090", "sm89", "1.7.1.116", "12.9")
    assert host_target(ENGINE, _rtx_host("1.7.1.116").replace(gpus=())) is None


# -- the dashboard: the Hosts view lists runtime caches per engine and GPU ---------------------------


def test_hosts_view_lists_published_stand_in_caches_per_engine_and_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with served_catalog(tmp_path / "home", monkeypatch) as app:
        at = view("hosts").run()
        assert not at.exception
        assert any("None published yet" in str(c.value) for c in [*at.markdown, *at.caption, *at.info])
        engine = _rtx_engine_row(app)
        for sku, name in (("NVIDIA GeForce RTX 4090", "4090"), ("NVIDIA RTX 4000 Ada", "ada")):
            publish_runtime_cache(
                app,
                engine.id or 0,
                _stand_in_cache(tmp_path, name, name.encode()),
                gpu_sku=sku,
                compute_capability="sm89",
                rtx_version="1.7.1",
                cuda_version="12.9",
            )
        at = view("hosts").run()
        assert not at.exception
        table = next(d.value for d in at.dataframe if {"GPU", "SM", "TensorRT-RTX"} <= set(d.value.columns))
        assert list(table["GPU"]) == ["NVIDIA GeForce RTX 4090", "NVIDIA RTX 4000 Ada"]
        assert set(table["engine"]) == {engine.id} and set(table["SM"]) == {"sm89"}


def test_backup_copies_a_published_stand_in_cache_blob(
    app_ctx: AppContext, pulled_rtx_engine: EngineRecord, tmp_path: Path
) -> None:
    engine = pulled_rtx_engine
    row = publish_runtime_cache(
        app_ctx,
        engine.id or 0,
        _stand_in_cache(tmp_path, "backup", b"backed up"),
        gpu_sku="NVIDIA GeForce RTX 4090",
        compute_capability="sm89",
        rtx_version="1.7.1",
        cuda_version="12.9",
    )
    result = backup(app_ctx, tmp_path / "backup")
    entries = [e for e in result.manifest["blobs"] if e["sha256"] == row.sha256]
    assert len(entries) == 1 and entries[0]["runtime_cache_ids"] == [row.id]
    assert (tmp_path / "backup" / entries[0]["path"]).read_bytes() == app_ctx.store.blob_path(row.sha256).read_bytes()


def test_load_engine_hands_the_chosen_stand_in_cache_path_to_the_backend(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The hand-over point of a load: the path chosen by `service.serving.runtimecache` reaches the
    backend's load in `LoadSpec.runtime_cache` (a real ORT engine stands in for an RTX one, which
    needs an RTX GPU; ORT ignores the field)."""
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    built = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    backend = get_backend("ort")
    seen: list[LoadSpec] = []
    for name in ("load", "load_file"):
        real = getattr(backend, name)

        def spy(source: Any, spec: LoadSpec, *rest: Any, _real: Any = real) -> Any:
            seen.append(spec)
            return _real(source, spec, *rest)

        monkeypatch.setattr(backend, name, spy)
    stand_in = _stand_in_cache(tmp_path, "handed", b"h")
    facts = engine_facts(app_ctx, built)
    session = load_engine(facts, PhaseTimer(), on_corrupt=lambda _r: None, runtime_cache=str(stand_in))
    session.close()
    session = load_engine(facts, PhaseTimer(), on_corrupt=lambda _r: None)
    session.close()
    assert [s.runtime_cache for s in seen] == [str(stand_in), None]


def test_an_up_to_date_pull_brings_a_stand_in_cache_published_since(
    app_ctx: AppContext, pulled_rtx_engine: EngineRecord, tmp_path: Path
) -> None:
    import tensorrt_rtx

    host, dest = _rtx_host(tensorrt_rtx.__version__), tmp_path / "pulled"
    first = pull(app_ctx, "mlp", dest, wanted=Wanted(backend="rtx"), host=host)
    assert "runtime_cache" not in first.manifest
    stand_in = _stand_in_cache(tmp_path, "since", b"published after the pull")
    row = publish_runtime_cache(
        app_ctx,
        pulled_rtx_engine.id or 0,
        stand_in,
        gpu_sku="NVIDIA GeForce RTX 4090",
        compute_capability="sm89",
        cuda_version="12.9",
        rtx_version=tensorrt_rtx.__version__,
    )
    second = pull(app_ctx, "mlp", dest, wanted=Wanted(backend="rtx"), host=host)
    assert not second.up_to_date and second.copied_bytes == row.size_bytes
    assert json.loads(second.manifest_path.read_text())["runtime_cache"]["id"] == row.id
    third = pull(app_ctx, "mlp", dest, wanted=Wanted(backend="rtx"), host=host)
    assert third.up_to_date and third.copied_bytes == 0


class StandInRtxSession:
    """Stands in for a loaded TensorRT-RTX session (`TensorRTEngineSession.runtime_cache_bytes`)."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data

    def runtime_cache_bytes(self) -> bytes | None:
        return self.data


def test_a_serving_process_publishes_its_stand_in_session_cache(catalog_ctx: AppContext) -> None:
    engine = _rtx_engine_row(catalog_ctx)
    key = {"gpu_sku": "NVIDIA GeForce RTX 4090", "compute_capability": "sm89", "rtx_version": "1.7.1"}
    data = b"opaque stand-in for the kernels a TensorRT-RTX session compiled"
    row = publish_session_cache(catalog_ctx, engine.id or 0, StandInRtxSession(data), cuda_version="12.9", **key)
    assert row is not None and catalog_ctx.store.blob_path(row.sha256).read_bytes() == data
    assert publish_session_cache(catalog_ctx, engine.id or 0, StandInRtxSession(None), **key) is None
    assert publish_session_cache(catalog_ctx, engine.id or 0, object()) is None  # no runtime cache: another backend
    assert list(catalog_ctx.store.tmp_dir.iterdir()) == []
