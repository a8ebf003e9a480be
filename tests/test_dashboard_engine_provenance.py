"""Issue 25 on the dashboard: an engine bundle (config.json, two real TensorRT-RTX rank engines, a
tokenizer) imported from the Engines view as an uploaded archive of its folder or, for admins, as a
folder on the server under ENGINECACHE_IMPORT_ROOTS, through the service `engine import FOLDER` runs
and audited as it is; the coverage matrix saying which cells name an imported engine, an imported
bundle or an UNPROVEN one, with a legend of the marks; and the engine page listing the runtime caches
published for its engine per GPU.

The rank engines are built once per module by `tests.test_engine_bundle.built` (a plain TensorRT-RTX
script). The runtime caches' bytes are opaque stand-ins (a real cache needs an RTX GPU): the tests
that publish them say so in their names."""

from __future__ import annotations

from pathlib import Path

from enginecache.core.fingerprint import host_fingerprint
from enginecache.dashboard.views import coverage as coverage_view
from enginecache.db import engines
from enginecache.db.models import utcnow
from enginecache.service.access.audit import current_actor
from enginecache.service.engines.bundles import import_engine_or_bundle
from enginecache.service.engines.provenance import IMPORTED, IMPORTED_BUNDLE, PROVENANCE_KINDS
from enginecache.service.fleet import coverage
from enginecache.service.fleet.runtimecaches import publish_runtime_cache
from enginecache.service.models.register import register_model
from tests.dashboardkit import Seeded, engine_view, frame, plain, texts, view
from tests.test_engine_bundle import built, make_bundle  # noqa: F401 - `built`: the real rank engines, once per module
from tests.test_engine_import import request

# -- the coverage matrix: imported, bundle and UNPROVEN cells -----------------------------------------


def _prove(seeded: Seeded, engine_id: int) -> None:
    """A host that can run it loaded it (as a passing test-load records it)."""
    with seeded.app.catalog.changes() as ex:
        engines.mark_proven(ex, engine_id, at=utcnow(), host="gpu-box-9", actor=current_actor(), by="test-load")


def test_the_coverage_matrix_marks_imported_bundle_and_unproven_cells_with_a_legend(
    seeded: Seeded,
    built: dict[str, Path],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    register_model(seeded.app, built["onnx"], name="mlp")
    bundle = import_engine_or_bundle(seeded.app, request(make_bundle(tmp_path / "llm", built)))
    # declared as CI would declare it: the header proves only 1.7.1, and the seeded worker runs 1.7.1.116
    version = host_fingerprint().packages["tensorrt_rtx"]
    single = import_engine_or_bundle(seeded.app, request(built["sm89"], targets=("sm89",), backend_version=version))
    _prove(seeded, single.engine_id)

    matrix = coverage.coverage(seeded.app)
    cells = {(c.model_id, c.precision, c.column.target): c for c in matrix.cells}
    unproven = cells[(bundle.model_id, "fp32", "sm86")]
    assert (unproven.state, unproven.engine_id, unproven.provenance) == (
        coverage.UNPROVEN,
        bundle.engine_id,
        IMPORTED_BUNDLE,
    )
    assert f"enginecache test-load {bundle.engine_id}" in unproven.reason
    proven = cells[(single.model_id, "fp32", "sm89")]
    assert (proven.state, proven.provenance) == (coverage.BUILT, IMPORTED)
    assert cells[(seeded.model_id, "fp32", "sm86")].text == f"BUILT · engine {seeded.engine_id}", "built here: no mark"

    at = view("coverage").run()
    assert not at.exception, at.exception
    shown = frame(at, "model", "precision").set_index(["model", "precision"])
    shown.columns = [str(c).split(" (", 1)[0] for c in shown.columns]  # "TensorRT-RTX sm86 (no host)"
    assert shown.loc[("mlp", "fp32"), "TensorRT-RTX sm86"] == f"UNPROVEN · engine {bundle.engine_id} · imported bundle"
    assert shown.loc[("mlp", "fp32"), "TensorRT-RTX sm89"] == f"BUILT · engine {single.engine_id} · imported"
    assert shown.loc[("convnet", "fp32"), "TensorRT-RTX sm86"] == f"BUILT · engine {seeded.engine_id}"
    assert (
        coverage_view._style(f"UNPROVEN · engine {bundle.engine_id} · imported bundle")
        == coverage_view._style("UNPROVEN")
        != coverage_view._style("MISSING")
    )
    legend = frame(at, "state", "means")
    assert coverage.UNPROVEN in list(legend["state"])
    marks = frame(at, "mark", "means")
    assert list(marks["mark"]) == ["STATE · engine N · imported", "STATE · engine N · imported bundle"]
    assert list(marks["means"]) == [PROVENANCE_KINDS[IMPORTED], PROVENANCE_KINDS[IMPORTED_BUNDLE]]
    assert "UNPROVEN 1" in texts(at)


# -- the engine page: runtime caches per GPU ----------------------------------------------------------


def _stand_in_cache(path: Path, content: bytes) -> Path:
    """Opaque bytes standing in for a serialized TensorRT-RTX runtime cache (one needs an RTX GPU)."""
    path.write_bytes(content)
    return path


def test_the_engine_page_lists_the_stand_in_runtime_caches_published_for_it_per_gpu(
    seeded: Seeded,
    built: dict[str, Path],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    app = seeded.app
    keys = [("NVIDIA RTX A6000", "sm86", "1.7.1", "12.9"), ("NVIDIA GeForce RTX 4090", "sm89", "1.7.1", "12.8")]
    for index, (sku, sm, rtx, cuda) in enumerate(keys):
        cache = _stand_in_cache(tmp_path / f"cache{index}.bin", f"stand-in runtime cache {index}".encode())
        publish_runtime_cache(
            app, seeded.engine_id, cache, gpu_sku=sku, compute_capability=sm, rtx_version=rtx, cuda_version=cuda
        )
    register_model(app, built["onnx"], name="mlp")
    other = import_engine_or_bundle(app, request(built["rank0"]))

    at = engine_view(seeded.engine_id).run()
    assert not at.exception, at.exception
    table = frame(at, "GPU", "SM", "TensorRT-RTX", "CUDA")
    assert sorted(zip(table["GPU"], table["SM"], table["TensorRT-RTX"], table["CUDA"], strict=True)) == sorted(keys)
    assert list(table["bytes"]) == [len(b"stand-in runtime cache 0")] * 2
    assert set(table["by"]) == {current_actor().name} and "engine" not in table.columns
    assert "**Runtime caches per GPU** (2 published, 2 GPU(s))" in texts(at)

    empty = engine_view(other.engine_id).run()
    assert "**Runtime caches per GPU** (0 published, 0 GPU(s))" in texts(empty)
    assert f"enginecache runtime-cache publish {other.engine_id} FILE" in plain(texts(empty))
