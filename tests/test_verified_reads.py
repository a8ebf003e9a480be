"""What a runtime is handed is what was verified, in the same pass: a build reads the stored model
files through hard links, hashed under read leases it checks once the backend is done (a write
meanwhile fails it, naming the file), or, where no lease can be had, a private copy hashed while it
was copied, as a test-load's accuracy reference does (a change to the store after the check cannot
reach it); a load hands a runtime no byte of an engine, not even its header, before the whole blob
matched its digest. The hit path's CORRUPT verdict is audited as the full path's is."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from enginecache.core.backends.base import BuildSpec
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.blobpaths import blob_path, model_file
from enginecache.core.filelease import take_read_lease
from enginecache.db.models import EngineRecord, EngineStatus, ModelStatus
from enginecache.errors import BuildFailedError, EngineRejectedError
from enginecache.service.access import audit
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testload import run_test_load
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine, list_engines
from enginecache.service.models import verify as modelverify
from enginecache.service.models.register import get_model, register_model
from enginecache.service.serving import hitpath
from enginecache.service.serving.loadpath import load_or_build_full
from tests.conftest import corrupt_blob
from tests.modelfactory import make_conv, make_external_data_model, make_mlp
from tests.servingkit import ORT, serve_mlp


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}


def _no_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a store this process does not own, or on NFS: no read lease can be had."""
    monkeypatch.setattr(modelverify, "take_read_lease", lambda _path: None)


@pytest.fixture
def leases_here(tmp_path: Path) -> None:
    """Skip where this host gives no read lease (NFS, a sandbox without /proc): builds copy there."""
    probe = tmp_path / "lease-probe"
    probe.write_bytes(b"probe")
    lease = take_read_lease(str(probe))
    if lease is None or not Path("/proc/locks").is_file():
        pytest.skip("no read lease can be had on this host's temporary folder: builds copy the model here")
    lease.close()


def _lease_breaking(path: Path) -> bool:
    """Whether a writer is breaking a lease on the file at `path` now (/proc/locks names its inode)."""
    inode = f":{path.stat().st_ino} "
    return any("LEASE  BREAKING" in line and inode in line for line in Path("/proc/locks").read_text().splitlines())


def _register(app: AppContext, tmp_path: Path, maker: Any) -> Path:
    """Register `maker`'s model as "m"; its stored model file."""
    source = maker(tmp_path / "src" / "model.onnx") if maker is make_mlp else maker(tmp_path / "src")
    model = register_model(app, source, name="m").model
    return model_file(app.home, model.digest, model.filename)


@pytest.mark.parametrize("maker", [make_mlp, make_external_data_model], ids=["single-file", "external-data"])
def test_a_build_reads_the_stored_files_linked_into_its_work_folder_not_a_copy(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, maker: Any, leases_here: None
) -> None:
    stored = _register(app_ctx, tmp_path, maker)
    genuine = _digests(stored.parent)
    inodes = _inodes(stored.parent)
    read_from, read_inodes, built = _build_watching_its_input(app_ctx, monkeypatch, _inodes)
    assert stored.parent not in read_from.parents, "the backend reads the build's work folder"
    assert read_inodes == inodes, "the stored files themselves, linked there: no copy of the model"
    assert built.status == EngineStatus.READY and _digests(stored.parent) == genuine
    assert not read_from.exists() and stored.is_file(), "the links went with the work folder, the store kept its files"


def _inodes(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.iterdir()}


def _build_watching_its_input(
    app: AppContext, monkeypatch: pytest.MonkeyPatch, look: Callable[[Path], Any]
) -> tuple[Path, Any, EngineRecord]:
    """Build model "m" on ORT with `look(folder)` run on the folder the backend reads its input from,
    as it is about to read it; returns that input's path, what `look` saw, and the built engine."""
    real_build = ORT_BACKEND.build
    seen: list[tuple[Path, Any]] = []

    def build_looking(spec: BuildSpec, *args: Any, **kwargs: Any) -> Any:
        seen.append((spec.onnx_path, look(spec.onnx_path.parent)))
        return real_build(spec, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "build", build_looking)
    engine = build_engine(app, BuildRequest(model="m", backend="ort")).engine
    [(read_from, looked)] = seen
    return read_from, looked, engine


def _break_lease(target: Path, writers: list[subprocess.Popen[bytes]]) -> None:
    """Another process opens the stored `target` for writing while a build holds its lease: the open
    waits for the lease (the backend reads the hashed bytes meanwhile), and the lease is broken."""
    target.chmod(0o644)
    code = f"open({str(target)!r}, 'r+b').write(b'tampered')"
    writers.append(subprocess.Popen([sys.executable, "-c", code]))
    deadline = time.monotonic() + 30
    while not _lease_breaking(target):
        assert time.monotonic() < deadline, "the writer never reached the lease"
        assert writers[-1].poll() is None, "the writer got through without breaking a lease"
        time.sleep(0.01)


def test_a_broken_lease_leaves_a_failing_backend_its_own_error(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leases_here: None
) -> None:
    """The lease check names a write only where nothing else failed: a backend's own failure stays
    the build's error (and its FAILED row's), the broken lease logged beside it."""
    stored = _register(app_ctx, tmp_path, make_mlp)
    writers: list[subprocess.Popen[bytes]] = []

    def write_then_fail(spec: BuildSpec, *args: Any, **kwargs: Any) -> Any:
        _break_lease(stored, writers)
        raise BuildFailedError("the backend's own failure")

    monkeypatch.setattr(ORT_BACKEND, "build", write_then_fail)
    try:
        with pytest.raises(BuildFailedError) as failed:
            build_engine(app_ctx, BuildRequest(model="m", backend="ort"))
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    assert "the backend's own failure" in str(failed.value)
    assert "opened for writing" not in str(failed.value)
    [engine] = list_engines(app_ctx)
    assert engine.status == EngineStatus.FAILED and "the backend's own failure" in (engine.error or "")


@pytest.mark.parametrize("maker", [make_mlp, make_external_data_model], ids=["single-file", "external-data"])
def test_a_stored_file_opened_for_writing_during_a_build_fails_it_naming_the_file(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, maker: Any, leases_here: None
) -> None:
    stored = _register(app_ctx, tmp_path, maker)
    target = sorted(stored.parent.iterdir())[-1]  # the model file, or its external data
    real_build = ORT_BACKEND.build
    writers: list[subprocess.Popen[bytes]] = []

    def write_then_build(spec: BuildSpec, *args: Any, **kwargs: Any) -> Any:
        _break_lease(target, writers)
        return real_build(spec, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "build", write_then_build)
    try:
        with pytest.raises(BuildFailedError) as failed:
            build_engine(app_ctx, BuildRequest(model="m", backend="ort"))
        assert writers[0].wait(timeout=30) == 0, "the writer goes on once the build gives its leases back"
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
    message = str(failed.value)
    assert "was opened for writing while it was being read" in message and target.name in message
    [engine] = list_engines(app_ctx)
    assert engine.status == EngineStatus.FAILED and engine.blob_path is None, "nothing was published"


@pytest.mark.parametrize("maker", [make_mlp, make_external_data_model], ids=["single-file", "external-data"])
def test_without_a_lease_a_build_reads_a_verified_copy_even_when_the_store_changes_after_the_check(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, maker: Any
) -> None:
    _no_leases(monkeypatch)
    stored = _register(app_ctx, tmp_path, maker)
    genuine = _digests(stored.parent)
    decoy = make_conv(tmp_path / "decoy" / "conv.onnx").read_bytes()

    def tamper_then_look(folder: Path) -> dict[str, str]:
        # After the check, before the backend reads: someone replaces every stored file.
        for path in stored.parent.iterdir():
            path.chmod(0o644)
            path.write_bytes(decoy)
        return _digests(folder)

    read_from, read_digests, engine = _build_watching_its_input(app_ctx, monkeypatch, tamper_then_look)
    assert stored.parent not in read_from.parents, "the backend read a private copy, not the store"
    assert read_digests == genuine, "the copy holds the bytes that hashed to the digest"
    assert engine.status == EngineStatus.READY
    assert not read_from.exists(), "the build's work folder (its copy) is removed with the build"


def test_without_a_lease_a_mlp_built_after_tampering_is_built_from_the_registered_bytes(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_leases(monkeypatch)
    model = register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    stored = model_file(app_ctx.home, model.digest, model.filename)
    decoy = make_conv(tmp_path / "conv.onnx").read_bytes()
    real_build = ORT_BACKEND.build

    def tamper_then_build(spec: BuildSpec, *args: Any, **kwargs: Any) -> Any:
        stored.chmod(0o644)
        stored.write_bytes(decoy)
        return real_build(spec, *args, **kwargs)

    monkeypatch.setattr(ORT_BACKEND, "build", tamper_then_build)
    built = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    assert [t["name"] for t in built.io] == ["input", "output"]
    assert built.io[0]["shape"][-1] == 16, "built from mlp's bytes, not the conv written over the store"


def test_a_test_load_reference_never_reads_a_tampered_source(app_ctx: AppContext, tmp_path: Path) -> None:
    model = register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    engine = build_engine(app_ctx, BuildRequest(model="mlp", backend="ort")).engine
    assert run_test_load(app_ctx, engine.id or 0).verdict == "PASS"
    corrupt_blob(model_file(app_ctx.home, model.digest, model.filename))  # a weight byte: it still parses

    run = run_test_load(app_ctx, engine.id or 0)
    assert run.verdict == "ERROR", run.reason
    assert model.digest in run.reason and "CORRUPT" in run.reason
    assert get_model(app_ctx, "mlp").status == ModelStatus.CORRUPT
    assert get_engine(app_ctx, engine.id or 0).status == EngineStatus.READY, "the engine itself is intact"


def _refuse_unverified(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the runtime was handed a header before the blob matched its digest")

    monkeypatch.setattr(ORT_BACKEND, "check_header", refuse)


@pytest.mark.parametrize("path", ["hit", "full"])
def test_a_damaged_header_is_corrupt_and_never_reaches_the_runtime(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    served = serve_mlp(app_ctx, tmp_path / "src")
    corrupt_blob(blob_path(app_ctx.home, served.engine.sha256), 8)  # inside the ORT-format header
    _refuse_unverified(monkeypatch)
    with pytest.raises(EngineRejectedError) as rejected:
        if path == "hit":
            hitpath.try_hit(
                served.onnx_path, ORT, home=app_ctx.home, db_url=app_ctx.db_url, host=None, started=time.perf_counter()
            )
        else:
            load_or_build_full(served.onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    assert rejected.value.verdict == "CORRUPT"
    assert get_engine(app_ctx, served.engine.id or 0).status == EngineStatus.CORRUPT
    [event] = audit.list_audit(app_ctx, action=audit.ENGINE_CORRUPT)
    assert event.target == f"engine {served.engine.id}"
    assert {k: event.details[k] for k in ("by", "was")} == {"by": "load_or_build", "was": "READY"}
    assert event.details["reason"], "the audit row says what did not match"
    assert event.actor == audit.local_actor().name and event.origin.startswith("cli ")


def test_the_hit_path_audits_a_corrupt_mark_once(app_ctx: AppContext, tmp_path: Path) -> None:
    served = serve_mlp(app_ctx, tmp_path / "src")
    corrupt_blob(blob_path(app_ctx.home, served.engine.sha256))
    for _ in range(2):  # the second call finds the engine CORRUPT already: no second event
        try:
            hitpath.try_hit(
                served.onnx_path, ORT, home=app_ctx.home, db_url=app_ctx.db_url, host=None, started=time.perf_counter()
            )
        except EngineRejectedError as err:
            assert err.verdict == "CORRUPT"
    assert len(audit.list_audit(app_ctx, action=audit.ENGINE_CORRUPT)) == 1


def test_a_copy_that_fails_midway_leaves_no_partial_model_for_the_backend(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = register_model(app_ctx, make_external_data_model(tmp_path / "ext"), name="ext").model
    (model_file(app_ctx.home, model.digest, model.filename).parent / "ext.onnx.data").unlink()
    called: list[BuildSpec] = []
    monkeypatch.setattr(ORT_BACKEND, "build", lambda spec, *a, **k: called.append(spec))
    with pytest.raises(Exception, match="missing"):
        build_engine(app_ctx, BuildRequest(model="ext", backend="ort"))
    assert called == [], "the backend never saw a bundle that did not verify"
    assert get_model(app_ctx, "ext").status == ModelStatus.CORRUPT


def test_a_miss_after_the_exact_engine_went_corrupt_names_it_and_the_fix(app_ctx: AppContext, tmp_path: Path) -> None:
    """Once the exact match is CORRUPT, the next lookup's miss said nothing of it (it named another
    backend's engine as nearest); it names the CORRUPT engine and the commands that fix it."""
    from enginecache.errors import MissError
    from enginecache.service.serving.runtime import load_or_build

    served = serve_mlp(app_ctx, tmp_path / "src")
    corrupt_blob(blob_path(app_ctx.home, served.engine.sha256))
    with pytest.raises(EngineRejectedError):
        load_or_build(served.onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    with pytest.raises(MissError) as missed:
        load_or_build(served.onnx_path, spec=ORT, app=app_ctx, on_miss="fail")
    said = str(missed.value)
    assert f"engine {served.engine.id} is the exact match but CORRUPT" in said, said
    assert f"enginecache verify {served.engine.id}" in said and "enginecache build mlp --backend ort" in said
    assert missed.value.nearest == {"id": served.engine.id, "status": "CORRUPT", "exact": True}
