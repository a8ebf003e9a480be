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

import io
import tarfile
import zipfile
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from enginecache.core.blobpaths import blob_path
from enginecache.core.enginebundle import parse_manifest
from enginecache.dashboard.data import ROLE_STATE
from enginecache.dashboard.views import coverage as coverage_view
from enginecache.dashboard.views.engineimport import NOT_IMPORTABLE
from enginecache.db import engines
from enginecache.db.models import EngineRecord, EngineStatus, utcnow
from enginecache.service.access.audit import current_actor, list_audit
from enginecache.service.engines.bundles import import_engine_or_bundle, is_bundle
from enginecache.service.engines.provenance import IMPORTED, IMPORTED_BUNDLE, PROVENANCE_KINDS
from enginecache.service.fleet import coverage
from enginecache.service.fleet.runtimecaches import publish_runtime_cache
from enginecache.service.models.register import register_model
from tests.conftest import files_under
from tests.dashboardkit import Seeded, engine_view, frame, plain, texts, view
from tests.test_engine_bundle import built, make_bundle  # noqa: F401 - `built`: the real rank engines, once per module
from tests.test_engine_import import engine_rows, request

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
    # version from the header alone (1.7.1), while the seeded worker runs 1.7.1.116: current, not STALE
    single = import_engine_or_bundle(seeded.app, request(built["sm89"], targets=("sm89",)))
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


# -- the import form: bundles as an archive or a folder on the server ---------------------------------


BUNDLE_FILES = ["config.json", "rank0.engine", "rank1.engine", "tokenizer/tokenizer.json"]


def _zip_of(folder: Path, *, top: str | None) -> bytes:
    """`folder`'s files zipped, under the folder `top` (None: at the archive's top)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for relative in files_under(folder):
            name = relative.as_posix() if top is None else f"{top}/{relative.as_posix()}"
            archive.write(folder / relative, name)
    return buffer.getvalue()


def _tgz_of(folder: Path) -> bytes:
    """`folder`'s files as a .tar.gz, at the archive's top."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for relative in files_under(folder):
            archive.add(folder / relative, relative.as_posix())
    return buffer.getvalue()


def _fill(at: AppTest, targets: str = "sm86") -> None:
    at.text_input(key="engines_import_model").set_value("mlp")
    at.selectbox(key="engines_import_backend").set_value("rtx")
    at.selectbox(key="engines_import_precision").set_value("fp32")
    at.text_input(key="engines_import_targets").set_value(targets)
    at.text_area(key="engines_import_notes").set_value("trtllm-build, CI run 7").run()


def _upload_and_import(seeded: Seeded, name: str, content: bytes, targets: str = "sm86") -> AppTest:
    at = engine_view(seeded.engine_id).run()
    at.get("file_uploader")[-1].upload(name, content).run()
    _fill(at, targets)
    at.button(key="engines_import_submit").click().run()
    assert not at.exception, at.exception
    return at


def _imported(seeded: Seeded) -> list[EngineRecord]:
    return [e for e in engine_rows(seeded.app) if e.provenance]


def _scratch(seeded: Seeded) -> list[Path]:
    """What imports left in the store's tmp/ (nothing, once they end)."""
    tmp = seeded.app.store.tmp_dir
    return sorted(p for p in tmp.iterdir() if p.name.startswith("upload-")) if tmp.is_dir() else []


@pytest.mark.parametrize(
    ("name", "pack"),
    [
        ("llm.zip", lambda folder: _zip_of(folder, top="llm")),  # an archive of the folder itself
        ("llm.tar.gz", _tgz_of),  # the folder's files at the archive's top
    ],
)
def test_the_engine_page_imports_a_bundle_uploaded_as_an_archive_of_its_folder(
    seeded: Seeded,
    built: dict[str, Path],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    name: str,
    pack: object,
) -> None:
    register_model(seeded.app, built["onnx"], name="mlp")
    source = make_bundle(tmp_path / "llm", built)
    at = _upload_and_import(seeded, name, pack(source))  # type: ignore[operator]
    (engine,) = _imported(seeded)
    assert is_bundle(engine) and engine.status == EngineStatus.UNPROVEN
    assert (engine.backend, engine.targets, engine.precision) == ("rtx", "sm86", "fp32")
    manifest = parse_manifest(blob_path(seeded.app.home, engine.sha256 or "").read_bytes())
    assert [f.path for f in manifest.files] == BUNDLE_FILES
    for entry in manifest.files:
        assert blob_path(seeded.app.home, entry.sha256).read_bytes() == (source / entry.path).read_bytes()
    assert engine.provenance["source"] == f"dashboard upload {name}"
    assert engine.provenance["declared"]["notes"] == "trtllm-build, CI run 7"
    assert f"engine {engine.id} (UNPROVEN), a bundle" in plain(texts(at)), "the outcome"
    (row,) = list_audit(seeded.app, action=engines.ENGINE_IMPORT)
    assert row.target == f"engine {engine.id}" and row.details["source"] == f"dashboard upload {name}"
    assert _scratch(seeded) == [], "the extracted folder is removed"

    page = texts(engine_view(engine.id or 0).run())
    assert "**provenance** imported bundle" in page


def test_a_bundle_archive_whose_rank_contradicts_the_declaration_is_refused_and_nothing_is_kept(
    seeded: Seeded,
    built: dict[str, Path],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    register_model(seeded.app, built["onnx"], name="mlp")
    objects = files_under(seeded.app.home / "objects")
    mixed = make_bundle(tmp_path / "mixed", built, rank1="sm89")
    at = _upload_and_import(seeded, "mixed.zip", _zip_of(mixed, top=None))
    errors = " ".join(plain(e.value) for e in at.error)
    assert "import refused" in errors and "rank1.engine" in errors and "SM89" in errors, errors
    assert str(seeded.app.store.tmp_dir) not in errors and str(seeded.app.home) not in errors, "no server path"
    assert _imported(seeded) == [] and files_under(seeded.app.home / "objects") == objects
    assert _scratch(seeded) == []


def test_an_admin_imports_a_bundle_folder_on_the_server_under_the_import_roots(
    seeded: Seeded,
    built: dict[str, Path],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register_model(seeded.app, built["onnx"], name="mlp")
    roots = tmp_path / "ci-artifacts"
    folder = make_bundle(roots / "llama" / "engines", built)
    outside = make_bundle(tmp_path / "elsewhere", built)
    (roots / "escape").symlink_to(outside)
    monkeypatch.setenv("ENGINECACHE_IMPORT_ROOTS", str(roots))

    for refused in (str(outside), str(roots / "escape"), str(roots / "missing"), "llama/engines"):
        at = engine_view(seeded.engine_id).run()
        at.text_input(key="engines_import_path").set_value(refused)
        _fill(at)
        at.button(key="engines_import_submit").click().run()
        errors = " ".join(plain(e.value) for e in at.error)
        assert NOT_IMPORTABLE in errors, (refused, errors)
    assert _imported(seeded) == []

    at = engine_view(seeded.engine_id).run()
    at.text_input(key="engines_import_path").set_value(str(folder))
    _fill(at)
    at.button(key="engines_import_submit").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    (engine,) = _imported(seeded)
    assert is_bundle(engine) and engine.status == EngineStatus.UNPROVEN
    assert engine.provenance["source"].startswith("dashboard server path ")
    assert engine.provenance["source"].endswith(f":{folder.resolve()}")
    (row,) = list_audit(seeded.app, action=engines.ENGINE_IMPORT)
    assert row.target == f"engine {engine.id}"


def test_an_operator_imports_uploads_but_gets_no_server_path(
    seeded: Seeded, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ENGINECACHE_IMPORT_ROOTS", str(tmp_path))
    at = engine_view(seeded.engine_id)
    at.session_state[ROLE_STATE] = "operator"
    at.run()
    assert not at.exception
    keys = [t.key for t in at.text_input]
    assert "engines_import_model" in keys and "engines_import_path" not in keys
    admin = engine_view(seeded.engine_id).run()
    assert "engines_import_path" in [t.key for t in admin.text_input]
