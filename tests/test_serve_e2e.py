"""End to end in a real browser: `enginecache serve` on a free port, headless Debian Chromium
through Playwright. Upload a model, build two precisions, wait for READY, open the engine,
verify its hash, see the charts, on a real model (../shared/models); a screenshot of each view lands
in the test's temp dir. docs/screenshots/ is made by tests/test_dashboard_e2e.py, the whole issue-12
walk through the dashboard."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

pytest.importorskip("playwright.sync_api")
from playwright.sync_api import expect, sync_playwright

from enginecache.db.models import EngineRecord, EngineStatus, JobRecord
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from tests.browserkit import (  # generous_expect: autouse, expect() waits TIMEOUT_MS
    generous_expect,  # noqa: F401
    launch,
    open_page,
    register_upload,
    submit_builds,
    wait_for_app_run,
    wait_for_charts,
)
from tests.conftest import shared_model, skip_or_fail
from tests.servekit import CHROMIUM, free_port, serve_command, stop_serve, wait_for_dashboard

ROOT = Path(__file__).resolve().parents[1]
# Generous everywhere: the machines running this are shared, and a wait ends as soon as its
# condition holds, so a long limit costs nothing when things are fast.
READY_SECONDS = 600.0  # both builds READY (fp16 converts the model first)
FRESH_SECONDS = 120.0  # a cached list showing what the worker just wrote (TTLs are seconds)
STOP_SECONDS = 120.0  # serve stopping its dashboard and worker on SIGTERM (the worker may get 30 s)
POLL_SECONDS = 0.5  # how often the catalog is polled (not a margin)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, AppContext]]:
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is absent (apt-get install chromium); browser tests need it")
    home = tmp_path / "home"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (HOME_ENV, DB_URL_ENV)}
    command = serve_command(home, port)
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    app = AppContext.from_settings(home)
    try:
        wait_for_dashboard(port, process)
        yield f"http://127.0.0.1:{port}", app
    finally:
        out = stop_serve(process, STOP_SECONDS)
        app.close()
        assert process.returncode == 0, out[-3000:]
    # serve stopped its worker: nothing of ours is left running
    leftover = subprocess.run(["pgrep", "-f", str(home)], capture_output=True, text=True).stdout.split()
    assert leftover == [], leftover


def _ready_engines(app: AppContext, count: int, timeout: float = READY_SECONDS) -> list[EngineRecord]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with app.catalog.read() as session:
            engines = session.exec(select(EngineRecord).order_by(EngineRecord.id)).all()
            jobs = session.exec(select(JobRecord)).all()
        failed = [e for e in engines if e.status == EngineStatus.FAILED]
        assert not failed, [(e.id, e.error) for e in failed]
        ready = [e for e in engines if e.status == EngineStatus.READY]
        if len(ready) >= count:
            return ready
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"engines did not get READY: {[(j.id, j.status, j.phase, j.error) for j in jobs]}")


@pytest.mark.shared
def test_upload_build_verify_and_charts_in_chromium(served: tuple[str, AppContext], tmp_path: Path) -> None:
    url, app = served
    model = shared_model("mobilenet_v3_small.onnx")
    shots = tmp_path / "screenshots"
    shots.mkdir()

    with sync_playwright() as pw:
        browser = launch(pw)
        page = open_page(browser)

        def goto_until(path: str, text: str, timeout: float = FRESH_SECONDS) -> None:
            """Open a page, reloading until `text` shows: the worker wrote the catalog from another
            process, and the dashboard's lists are cached for a few seconds. Each load is waited
            for to the end of its script run before the text is looked for."""
            deadline = time.monotonic() + timeout
            while True:
                page.goto(f"{url}{path}")
                wait_for_app_run(page)
                if page.get_by_text(text).count() > 0:
                    expect(page.get_by_text(text).first).to_be_visible()
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"{path} did not show {text!r} within {timeout:.0f} s")

        def shot(name: str) -> None:
            wait_for_app_run(page)
            wait_for_charts(page)
            path = shots / f"{name}.png"
            page.screenshot(path=str(path))

        # Models: upload, see it registered with its digest and dynamic dims
        page.goto(f"{url}/models")
        expect(page.get_by_role("heading", name="Models", exact=True)).to_be_visible()
        register_upload(page, model)
        expect(page.get_by_text("Lineage")).to_be_visible()

        # Build: two precisions for one target, live progress; fp32 alone is preselected (fp16 has not
        # built for this model yet), so fp16 is chosen as an operator would
        page.goto(f"{url}/build")
        expect(page.get_by_role("button", name="Submit 1 build(s)")).to_be_enabled()
        page.get_by_role("combobox", name="Precisions").click()
        page.get_by_role("option", name="fp16", exact=True).click()
        page.keyboard.press("Escape")
        submit_builds(page, 2)
        shot("build")
        engines = _ready_engines(app, 2)
        assert sorted(e.precision for e in engines) == ["fp16", "fp32"]
        # the job list redraws itself from the catalog while jobs run: no reload needed
        expect(page.get_by_role("link", name=f"engine {engines[-1].id}").first).to_be_visible()

        # Models again, now with the fp16 variant, its lineage and the op histogram
        goto_until("/models", "Models (1, and 1 converted variant(s))")
        expect(page.get_by_text("converted").first).to_be_visible()
        expect(page.locator(".js-plotly-plot").first).to_be_visible()
        shot("models")

        # Engines: open one, verify its hash, check compatibility
        engine = engines[0]
        page.goto(f"{url}/engines?engine={engine.id}")
        expect(page.get_by_text(f"Engine {engine.id}:").first).to_be_visible()
        expect(page.get_by_text(engine.sha256 or "?").first).to_be_visible()
        page.get_by_role("button", name="Verify hash").click()
        expect(page.get_by_text(f"sha256 {engine.sha256} matches")).to_be_visible()
        page.get_by_role("button", name="Check compatibility").click()
        expect(page.get_by_text("built for SM86 with TensorRT-RTX").first).to_be_visible()
        shot("engines")
        with app.catalog.read() as session:
            verified = session.get(EngineRecord, engine.id)
        assert verified is not None and verified.verified_at is not None

        # Timings: the charts are drawn
        page.goto(f"{url}/timings")
        expect(page.get_by_text("Build time by model, target and precision")).to_be_visible()
        expect(page.locator(".js-plotly-plot").nth(1)).to_be_visible()  # build time, size against it
        shot("timings")

        # Hosts: serve's own worker is online
        page.goto(f"{url}/hosts")
        expect(page.get_by_text("Can build:")).to_be_visible()
        shot("hosts")

        # Overview last: counts of what this test made
        page.goto(f"{url}/")
        expect(page.get_by_role("heading", name="Overview")).to_be_visible()
        expect(page.get_by_text("Cache activity").first).to_be_visible()
        shot("overview")
        browser.close()

    assert sorted(p.name for p in shots.iterdir()) == [
        f"{n}.png" for n in ("build", "engines", "hosts", "models", "overview", "timings")
    ]
