"""`enginecache gc` on the blobs and model bundles of a real store and catalog (SQLite, and
PostgreSQL where the catalog's answers matter): unreferenced blobs and bundles go only with --apply,
referenced ones stay; retired engines' blobs go past the grace (counted from the retirement) and
stay within it.

Ages come from the injected clock and from file times set in the past: nothing sleeps."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine, retire_engine
from enginecache.service.models.register import register_model
from tests.clirunner import run_cli
from tests.conftest import FakeClock
from tests.gckit import DAY, HOUR, add_engine_row, ort_engine, removed_paths, run_gc, set_age
from tests.modelfactory import make_external_data_model, make_mlp

# -- unreferenced blobs and bundles -----------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], app: AppContext, *args: str) -> dict[str, Any]:
    """`enginecache gc ARGS --json` in this process (the real clock): its one document."""
    result = run_cli(capsys, "--home", str(app.home), "--db", app.db_url, "gc", *args, "--json")
    assert result.code == 0, result.err
    document: dict[str, Any] = json.loads(result.out)
    return document


def test_an_unreferenced_blob_goes_only_with_apply_and_a_referenced_one_stays(
    catalog_ctx: AppContext, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    app = catalog_ctx
    engine = ort_engine(app, make_mlp(tmp_path / "mlp.onnx"), "mlp")
    ext = make_external_data_model(tmp_path / "ext")
    registered = register_model(app, ext, name="ext").model
    orphan = app.store.write_blob([b"no row names these bytes" * 100])
    unregistered = make_external_data_model(tmp_path / "other", seed=1)
    loose_bundle = app.store.put_model_bundle(unregistered, ["ext.onnx.data"], "f" * 64).parent
    for path in (orphan.path, app.home / (engine.blob_path or ""), app.home / "models", loose_bundle):
        set_age(path, 2 * HOUR)  # old enough: only a reference keeps it

    dry = _cli(capsys, app)
    assert dry["applied"] is False
    assert {(r["kind"], r["path"], r["bytes"]) for r in dry["remove"]} == {
        ("unreferenced_blob", app.store.relative(orphan.path), orphan.size),
        ("unreferenced_bundle", "models/" + "f" * 64, sum(f.stat().st_size for f in loose_bundle.iterdir())),
    }
    assert dry["remove_bytes"] == sum(r["bytes"] for r in dry["remove"])
    assert orphan.path.is_file() and loose_bundle.is_dir()  # a dry run removes nothing

    applied = _cli(capsys, app, "--apply")
    assert applied["applied"] is True and applied["errors"] == []
    assert {r["path"] for r in applied["remove"]} == {r["path"] for r in dry["remove"]}
    assert not orphan.path.exists() and not loose_bundle.exists()
    assert (app.home / (engine.blob_path or "")).is_file()
    assert app.store.verify_blob(engine.sha256 or "").sha256 == engine.sha256
    bundle = app.home / registered.store_path
    assert bundle.is_file() and (bundle.parent / "ext.onnx.data").is_file()  # its external data too
    assert get_engine(app, engine.id or 0).status == EngineStatus.READY
    assert _cli(capsys, app, "--apply")["remove"] == []  # nothing left to do


def test_a_young_unreferenced_blob_stays_and_a_recent_jobs_input_blob_stays(app_ctx: AppContext) -> None:
    app, clock = app_ctx, FakeClock()
    young = app.store.write_blob([b"published a moment ago"])
    calibration = app.store.write_blob([b"a queued build's calibration data"])
    queue.enqueue(app.catalog, kind="build", payload={"calibration": str(calibration.path)}, requirements={})
    set_age(calibration.path, 2 * HOUR)
    report = run_gc(app, clock, apply=True)
    assert report.removals == []
    assert [(k.kind, k.path) for k in report.kept] == [("unreferenced_blob", app.store.relative(young.path))]
    assert young.path.is_file() and calibration.path.is_file()


# -- retired engines --------------------------------------------------------------------------


def test_a_retired_engines_blob_goes_past_the_grace_and_stays_within_it(app_ctx: AppContext, tmp_path: Path) -> None:
    app, clock = app_ctx, FakeClock()
    retired = ort_engine(app, make_mlp(tmp_path / "a.onnx", seed=1), "a")
    ready = ort_engine(app, make_mlp(tmp_path / "b.onnx", seed=2), "b")
    retire_engine(app, retired.id or 0, clock=clock)
    blob = app.home / (retired.blob_path or "")
    old_twin = add_engine_row(  # a RETIRED row long past the grace, with the READY engine's very bytes
        app,
        ready.model_id,
        status=EngineStatus.RETIRED,
        sha256=ready.sha256,
        blob_path=ready.blob_path,
        created_at=clock.now - timedelta(days=90),
    )

    clock.advance(6 * DAY)  # within the default 7 days
    assert run_gc(app, clock, apply=True).removals == []
    assert blob.is_file()
    assert removed_paths(run_gc(app, clock, apply=False, grace=timedelta(days=5)), "retired_blob") == {
        retired.blob_path
    }

    clock.advance(2 * DAY)  # 8 days: past the grace
    report = run_gc(app, clock, apply=True)
    assert [(r.kind, r.path, r.engine_ids) for r in report.removals] == [
        ("retired_blob", retired.blob_path, (retired.id,))
    ]
    assert not blob.exists()
    row = get_engine(app, retired.id or 0)
    assert row.status == EngineStatus.RETIRED and row.blob_path is None and row.sha256 == retired.sha256
    assert (app.home / (ready.blob_path or "")).is_file()  # READY: kept however old, whoever else names it
    assert get_engine(app, old_twin).blob_path == ready.blob_path


def test_the_grace_counts_from_the_retirement_not_from_the_build(app_ctx: AppContext, tmp_path: Path) -> None:
    """An engine built a month ago and retired today keeps its blob for the grace period after today."""
    app, clock = app_ctx, FakeClock()
    old = ort_engine(app, make_mlp(tmp_path / "old.onnx", seed=3), "old")
    with app.catalog.write() as session:
        row = session.get(EngineRecord, old.id)
        assert row is not None
        row.created_at = row.finished_at = clock.now - timedelta(days=30)
        session.add(row)
    retire_engine(app, old.id or 0, clock=clock)
    assert get_engine(app, old.id or 0).retired_at == clock.now
    clock.advance(6 * DAY)
    assert run_gc(app, clock, apply=True).removals == [], "retired 6 days ago: within the grace"
    clock.advance(2 * DAY)
    assert removed_paths(run_gc(app, clock, apply=True), "retired_blob") == {old.blob_path}
