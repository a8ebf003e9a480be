"""Bounded input, external data: offsets and lengths checked at `model add`; deterministic build
failures FAILED at once, the host's (the store) retried. The read-only store is a read-only bind
mount of its objects (root only; skipped with the reason elsewhere, failing under CI=true)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import onnx
import pytest
from sqlmodel import select

from enginecache.core import onnx_graph
from enginecache.db import queue
from enginecache.db.models import EngineRecord, JobStatus
from enginecache.errors import ExternalDataError
from enginecache.service.builds.plan import BuildRequest
from enginecache.service.builds.submit import submit_build
from enginecache.service.context import AppContext
from enginecache.service.jobs.worker import Worker, WorkerConfig
from enginecache.service.models.register import register_model
from tests.boundedkit import mount, nothing_stored
from tests.clirunner import run_cli
from tests.modelfactory import make_external_data_model, make_mlp, save_unchecked


def external_model(folder: Path, tensor: str = "w1", **entries: str | None) -> Path:
    """The 64x64 MLP with external data (`ext.onnx` + `ext.onnx.data`, 33,024 bytes: w1 at 0,
    16,384 bytes; b1 at 16,384, 256; w2 at 16,640, 16,384), `tensor`'s entries set (None removes one)."""
    path = make_external_data_model(folder)
    model = onnx.load(str(path), load_external_data=False)
    target = next(t for t in model.graph.initializer if t.name == tensor)
    info = {e.key: e.value for e in target.external_data}
    for key, value in entries.items():
        if value is None:
            info.pop(key, None)
        else:
            info[key] = value
    del target.external_data[:]
    for key, value in info.items():
        entry = target.external_data.add()
        entry.key, entry.value = key, value
    return save_unchecked(model, path)


def engine_rows(app: AppContext) -> list[EngineRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(EngineRecord)).all())


def run_job(app: AppContext, job_id: int) -> None:
    """A worker for this one job until it is finished, retrying at once (no backoff to wait through)."""
    Worker(app, WorkerConfig(name="w", job_id=job_id, backoff_base_seconds=0.0, backoff_max_seconds=0.0)).run()


# -- external data offsets and lengths at `model add` -----------------------------------------


@pytest.mark.parametrize(
    ("entries", "shown"),
    [
        ({"offset": "-1000"}, "offset '-1000'"),
        ({"length": "-5"}, "length '-5'"),
        ({"offset": str(10**12), "length": None}, f"offset {10**12}"),
        ({"offset": "1.5"}, "offset '1.5'"),
        ({"length": "0x40"}, "length '0x40'"),
        ({"offset": "30000"}, "offset 30000"),  # 30,000 + 16,384 > 33,024
        ({"length": "8"}, "length 8"),  # w1 (float32 64x64) needs 16,384
        ({"length": "20000"}, "length 20000"),
    ],
)
def test_bad_offsets_and_lengths_are_refused_at_model_add(
    app_ctx: AppContext, tmp_path: Path, entries: dict[str, str | None], shown: str
) -> None:
    path = external_model(tmp_path / "m", **entries)
    with pytest.raises(ExternalDataError) as exc:
        register_model(app_ctx, path)
    message = str(exc.value)
    assert "'w1'" in message and "'ext.onnx.data'" in message and shown in message, message
    assert nothing_stored(app_ctx)


def test_cli_model_add_of_a_negative_offset_exits_2_and_stores_nothing(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = external_model(tmp_path / "m", offset="-1000")
    result = run_cli(capsys, "--home", str(app_ctx.home), "model", "add", str(path))
    assert result.code == 2, result.err
    assert "tensor 'w1'" in result.err and "offset '-1000'" in result.err
    assert nothing_stored(app_ctx)


def test_offsets_and_lengths_that_fit_are_accepted(app_ctx: AppContext, tmp_path: Path) -> None:
    """The last tensor without a length reads to the end of the file: exactly the bytes it needs."""
    path = external_model(tmp_path / "m", tensor="w2", length=None)
    assert register_model(app_ctx, path).created


# -- deterministic and transient build failures -----------------------------------------------


@pytest.mark.slow
def test_a_model_registered_before_offsets_were_checked_fails_its_build_once(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """w1 says 8 bytes where its dims need 16,384: the fp16 conversion fails on it the same way on
    every attempt (before this check, DEAD after 3 attempts and 3 FAILED engine rows). The catalog
    is made as `model add` made it before it checked lengths; the worker's children run the real
    checks."""
    path = external_model(tmp_path / "m", length="8")
    with monkeypatch.context() as before:
        before.setattr(onnx_graph, "_extent_problem", lambda *_args: None)
        register_model(app_ctx, path, name="old")
    request = BuildRequest(model="old", backend="ort", targets=("cpu",), precision="fp16")
    job = submit_build(app_ctx, request).job
    assert job is not None
    run_job(app_ctx, job.id or 0)
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.FAILED and done.attempts == 1, (done.status, done.attempts, done.error)
    error = done.error or ""
    assert "'w1'" in error and "'ext.onnx.data'" in error and "length 8" in error, error
    assert engine_rows(app_ctx) == [], "refused before a build started"


@pytest.mark.slow
def test_external_data_made_bad_after_registration_fails_the_build_once(app_ctx: AppContext, tmp_path: Path) -> None:
    """The stored model's w1 offset rewritten to -1000 after `model add`: the stored bundle is no
    longer what was registered, which the build's own integrity check names (the model CORRUPT);
    either way one attempt, FAILED, never retried."""
    registered = register_model(app_ctx, external_model(tmp_path / "m"), name="ext").model
    stored = app_ctx.home / registered.store_path
    stored.chmod(0o644)
    external_model(tmp_path / "bad", offset="-1000")  # the same model, w1 at offset -1000
    shutil.copyfile(tmp_path / "bad" / "ext.onnx", stored)
    job = submit_build(app_ctx, BuildRequest(model="ext", backend="ort", targets=("cpu",), precision="fp32")).job
    assert job is not None
    run_job(app_ctx, job.id or 0)
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.FAILED and done.attempts == 1, (done.status, done.attempts, done.error)
    assert [row.status for row in engine_rows(app_ctx)] == ["FAILED"], "left to the build, which names it"


@pytest.mark.slow
def test_a_store_that_cannot_be_written_is_retried_not_failed(app_ctx: AppContext, tmp_path: Path) -> None:
    """The engine blob cannot be published (objects/ became read-only, as a filesystem remounted
    read-only after errors is): StoreError, the host's problem, so each attempt is retried until the
    job is DEAD; never FAILED as if the request were at fault."""
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    objects = app_ctx.home / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    mount("--bind", str(objects), str(objects))
    try:
        mount("-o", "remount,ro,bind", str(objects))
        request = BuildRequest(model="mlp", backend="ort", targets=("cpu",), precision="fp32")
        job = submit_build(app_ctx, request, max_attempts=2).job
        assert job is not None
        run_job(app_ctx, job.id or 0)
    finally:
        subprocess.run(["umount", str(objects)], check=True)
    done = queue.get_job(app_ctx.catalog, job.id or 0)
    assert done.status == JobStatus.DEAD and done.attempts == 2, (done.status, done.attempts, done.error)
    assert "could not publish" in (done.error or "") and "Read-only file system" in (done.error or ""), done.error
    assert [row.status for row in engine_rows(app_ctx)] == ["FAILED", "FAILED"]
