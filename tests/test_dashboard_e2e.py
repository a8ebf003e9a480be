"""The dashboard end to end in a real browser (issue 12): `enginecache serve` (its own worker) on a
free port, headless Debian Chromium through Playwright, two small models from tests/modelfactory.py
(a conv "detector", an MLP "encoder").

Upload both; one submit mixing fp32, fp16 and int8 (with calibration data) that turns READY in the
Build matrix without a reload; retire an engine and see it RETIRED and its coverage cell MISSING;
build a missing cell from the coverage matrix opened by a deep link with filters, watch it turn
READY, and open the same link again to get the same view; test-load that engine with an uploaded
.npz and read the accuracy table with its tolerances. A screenshot of each view lands in the test's
temp dir, and in ENGINECACHE_SCREENSHOTS when set: that is how docs/screenshots/ is made
(`ENGINECACHE_SCREENSHOTS=docs/screenshots pytest tests/test_dashboard_e2e.py`)."""

from __future__ import annotations

import io
import os
import re
import shutil
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
from sqlmodel import select

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import Page, expect, sync_playwright

from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, LoadRunRecord, ModelRecord
from enginecache.service.context import AppContext
from tests import browserkit
from tests.browserkit import generous_expect  # noqa: F401 - autouse: expect() waits TIMEOUT_MS
from tests.modelfactory import make_conv, make_mlp
from tests.test_serve_e2e import (
    FRESH_SECONDS,
    POLL_SECONDS,
    READY_SECONDS,
    _ready_engines,
    served,  # noqa: F401 - the fixture: `enginecache serve` on a free port
)

SHOTS = ("build", "coverage", "engines", "hosts", "models", "overview", "timings")
RTX_SM86 = "TensorRT-RTX sm86"


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    path.write_bytes(buffer.getvalue())
    return path


def _wait_for(what: str, found: object, timeout: float = READY_SECONDS) -> None:
    """Poll the catalog until `found()` is truthy (the worker writes it from another process)."""
    deadline = time.monotonic() + timeout
    while not found():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


def _model_id(app: AppContext, name: str) -> int:
    with app.catalog.read() as session:
        return int(session.exec(select(ModelRecord).where(ModelRecord.name == name)).one().id or 0)


def _choose(page: Page, box: str, *options: str) -> None:
    """Pick `options` in the multiselect or selectbox `box`, each from a dropdown opened after the
    page's script run ended: a run that ends while the dropdown is open redraws the widget and closes
    it, and the option is then never found."""
    for option in options:
        browserkit.wait_for_app_run(page)
        page.get_by_role("combobox", name=box).click()
        page.get_by_role("option", name=option, exact=True).click()
        page.keyboard.press("Escape")


@pytest.mark.slow
def test_two_models_mixed_precisions_coverage_retire_and_test_load_in_chromium(
    served: tuple[str, AppContext],  # noqa: F811 - the fixture imported above
    tmp_path: Path,
) -> None:
    url, app = served
    models = tmp_path / "models"
    detector = make_conv(models / "detector.onnx")
    encoder = make_mlp(models / "encoder.onnx", features=16, hidden=32)
    rng = np.random.default_rng(0)
    calibration = _npz(tmp_path / "calibration.npz", input=rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    inputs = _npz(tmp_path / "encoder-inputs.npz", input=rng.standard_normal((4, 16)).astype(np.float32))
    shots = tmp_path / "screenshots"
    shots.mkdir()
    extra = os.environ.get("ENGINECACHE_SCREENSHOTS")

    with sync_playwright() as pw:
        browser = browserkit.launch(pw)
        page = browserkit.open_page(browser)
        # Offline: every request the page makes (documents, scripts, fonts, the favicon, the
        # WebSocket, images) goes to the dashboard's own host; data: and blob: URLs have none.
        requested: list[str] = []
        page.on("request", lambda request: requested.append(request.url))
        page.on("websocket", lambda socket: requested.append(socket.url))

        def open_view(path: str) -> None:
            page.goto(f"{url}{path}")
            browserkit.wait_for_app_run(page)

        def shot(name: str) -> None:
            browserkit.wait_for_app_run(page)
            browserkit.wait_for_charts(page)
            path = shots / f"{name}.png"
            page.screenshot(path=str(path), full_page=True)
            if extra:
                Path(extra).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(extra) / path.name)

        # Models: two uploads, each registered under its file's name
        for model in (detector, encoder):
            open_view("/models")  # a fresh uploader: it keeps every file given to it
            browserkit.register_upload(page, model)
        detector_id, encoder_id = _model_id(app, "detector"), _model_id(app, "encoder")

        # Build: the detector at fp32 + fp16 + int8 in one submit (calibration for the int8 cell only)
        open_view("/build")
        _choose(page, "Model", "detector v1")
        expect(page.get_by_role("button", name="Submit 1 build(s)")).to_be_enabled()
        _choose(page, "Precisions", "fp16", "int8")
        page.locator("input[type=file]").first.set_input_files(str(calibration))
        browserkit.submit_builds(page, 3)
        shot("build")
        engines = _ready_engines(app, 3)
        assert sorted(e.precision for e in engines) == ["fp16", "fp32", "int8"]
        # the matrix turns READY by itself: each cell links its engine, with no reload
        for engine in engines:
            link = page.get_by_role("link", name=f"{RTX_SM86} {engine.precision}: engine {engine.id}")
            browserkit.expect_once(link, timeout_ms=READY_SECONDS * 1000)
        submit_none = page.get_by_role("button", name="Submit 0 build(s)")
        browserkit.expect_once(submit_none)
        expect(submit_none.first).to_be_disabled()  # a rerun may draw a stale copy beside it again

        # Coverage of the detector at fp32 on TensorRT-RTX, every target: the sm86 cell is built (READY,
        # or BUILT where no known host has an SM86 GPU, as on a CPU-only machine), 5 are missing
        deep = f"/coverage?model={detector_id}&backend=rtx&precision=fp32&targets=all"
        open_view(deep)
        expect(page.get_by_text("STALE 0 · BUILDING 0 · FAILED 0 · MISSING 5")).to_be_visible()

        # Engines: retire the fp32 engine; it says RETIRED, and its coverage cell is MISSING
        fp32 = next(e for e in engines if e.precision == "fp32")
        open_view(f"/engines?engine={fp32.id}")
        page.get_by_role("button", name="Retire").click()
        page.get_by_role("button", name="Confirm retire").click()
        expect(page.get_by_text(f"engine {fp32.id} retired: cache lookups no longer return it")).to_be_visible()
        expect(page.get_by_test_id("stMetricValue").filter(has_text="RETIRED")).to_be_visible()
        expect(page.get_by_role("button", name="Retire")).to_be_disabled()
        open_view(deep)
        expect(
            page.get_by_text("READY 0 · BUILT 0 · INCOMPATIBLE 0 · STALE 0 · BUILDING 0 · FAILED 0 · MISSING 6")
        ).to_be_visible()

        # Coverage: a deep link to the encoder on ONNX Runtime at fp32, one missing cell, built in one click;
        # the matrix turns READY by itself
        deep = f"/coverage?model={encoder_id}&backend=ort&precision=fp32"
        open_view(deep)
        expect(
            page.get_by_text("READY 0 · BUILT 0 · INCOMPATIBLE 0 · STALE 0 · BUILDING 0 · FAILED 0 · MISSING 1")
        ).to_be_visible()
        page.get_by_role("button", name="Build 1 missing or stale cell(s)").click()
        expect(page.get_by_text(re.compile(r"encoder fp32 ONNX Runtime .*: queued job \d+"))).to_be_visible()
        browserkit.expect_once(
            page.get_by_text("READY 1 · BUILT 0 · INCOMPATIBLE 0 · STALE 0 · BUILDING 0 · FAILED 0 · MISSING 0"),
            timeout_ms=READY_SECONDS * 1000,
        )
        build_none = page.get_by_role("button", name="Build 0 missing or stale cell(s)")
        browserkit.expect_once(build_none)
        expect(build_none.first).to_be_disabled()  # a rerun may draw a stale copy beside it again
        # the same link in a new tab reproduces the view: its filters and its matrix
        again = browser.new_page(viewport=browserkit.VIEWPORT)
        again.goto(f"{url}{deep}")
        browserkit.wait_for_app_run(again)
        for chip in ("encoder", "ONNX Runtime", "fp32"):
            expect(again.get_by_test_id("stMultiSelect").get_by_text(chip, exact=True)).to_be_visible()
        expect(
            again.get_by_text("READY 1 · BUILT 0 · INCOMPATIBLE 0 · STALE 0 · BUILDING 0 · FAILED 0 · MISSING 0")
        ).to_be_visible()
        again.close()
        # the whole matrix, every model and three precisions
        open_view("/coverage?precision=fp32,fp16,int8")
        expect(page.get_by_text(re.compile(r"READY 1 · BUILT \d+ · INCOMPATIBLE \d+ · STALE 0"))).to_be_visible()
        shot("coverage")

        # Engines: test-load the encoder's engine with an uploaded .npz; the accuracy table per output
        with app.catalog.read() as session:
            [ort] = session.exec(select(EngineRecord).filter_by(backend="ort", status=EngineStatus.READY)).all()
        open_view(f"/engines?engine={ort.id}")
        # Open the inputs expander and choose an upload; a click that lands while the page is still
        # settling can be lost, so each step waits for its effect (the uploader) and is tried again.
        inputs_region = page.get_by_role("region", name="Inputs (.npz, one array per engine input, by name)")
        uploader = inputs_region.locator("input[type=file]")  # the page has other uploaders (engine import)
        upload_choice = page.get_by_text("an .npz I upload")
        for _attempt in range(4):
            if not upload_choice.is_visible():
                page.get_by_text("Test-load inputs").click()
            upload_choice.click()
            try:
                expect(uploader).to_be_attached(timeout=15_000)
                break
            except AssertionError:
                browserkit.wait_for_app_run(page)
        uploader.set_input_files(str(inputs))
        expect(page.get_by_text("encoder-inputs.npz fits the engine's inputs: input float32 [4, 16]")).to_be_visible()
        test_load = page.get_by_role("button", name="Test-load")
        expect(test_load).to_be_enabled()
        test_load.click()

        def loaded() -> bool:
            with app.catalog.read() as session:
                return session.exec(select(LoadRunRecord).where(LoadRunRecord.engine_id == ort.id)).first() is not None

        _wait_for("the test-load run", loaded)
        # the page redraws itself once the job ends (no reload); its run is under the Test-loads tab
        latest = page.get_by_text(re.compile(r"Latest test-load .*PASS"))
        deadline = time.monotonic() + FRESH_SECONDS
        while True:
            page.get_by_role("tab", name="Test-loads").click()
            if latest.is_visible():
                break
            assert time.monotonic() < deadline, "the engine page did not show its test-load run"
            time.sleep(POLL_SECONDS)
        expect(page.get_by_text(re.compile(r"fp32 tolerances: atol 0\.0001, rtol 0\.001"))).to_be_visible()
        with app.catalog.read() as session:
            run = session.exec(select(LoadRunRecord).where(LoadRunRecord.engine_id == ort.id)).one()
            job = session.get(JobRecord, run.job_id)
        assert run.verdict == "PASS", run.reason
        assert job is not None and job.payload["inputs_sha256"] is not None, "the uploaded inputs, not generated ones"
        assert run.input_shapes == {"input": [4, 16]}
        expect(page.get_by_text("Accuracy against ONNX Runtime on the source fp32 model").first).to_be_visible()
        # the shot starts at the test-load: its verdict, the inputs it used, the accuracy per output
        page.get_by_role("tab", name="Test-loads").evaluate("tab => tab.scrollIntoView({block: 'start'})")
        shot("engines")

        # Models: both, the detector with its fp16 and int8 variants
        open_view(f"/models?model={detector_id}")
        expect(page.get_by_text("converted").first).to_be_visible()
        shot("models")

        # Timings, Hosts (what serve's worker loads and lacks), Overview
        open_view("/timings")
        expect(page.get_by_text("Build time by model, target and precision")).to_be_visible()
        shot("timings")
        open_view("/hosts")
        expect(page.get_by_text("Engines it can load")).to_be_visible()
        shot("hosts")
        open_view("/")
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        shot("overview")
        browser.close()

    own = urlparse(url).hostname
    elsewhere = sorted(
        {u for u in requested if urlparse(u).scheme not in ("data", "blob") and urlparse(u).hostname != own}
    )
    assert requested and not elsewhere, f"requests that left the machine: {elsewhere}"

    assert sorted(p.name for p in shots.iterdir()) == [f"{n}.png" for n in SHOTS]
