"""End to end in a real browser: `enginecache serve` on a free port, headless Debian Chromium
through Playwright. Upload a model, build two precisions, wait for READY, open the engine,
verify its hash, see the charts; a screenshot of each view lands in the test's temp dir (and in
ENGINECACHE_SCREENSHOTS when set, which is how docs/screenshots/ was made)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select

from enginecache.db.models import EngineRecord, EngineStatus, JobRecord
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from tests.conftest import shared_model, skip_or_fail

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
VIEWPORT = {"width": 1440, "height": 1600}
TIMEOUT_MS = 30_000


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_health(port: int, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"enginecache serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                if response.read() == b"ok":
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError("the dashboard never answered /_stcore/health")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, AppContext]]:
    if not CHROMIUM.exists():
        skip_or_fail(f"{CHROMIUM} is absent (apt-get install chromium); browser tests need it")
    pytest.importorskip("playwright.sync_api")
    home = tmp_path / "home"
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in (HOME_ENV, DB_URL_ENV)}
    command = [sys.executable, "-m", "enginecache.cli", "--home", str(home), "serve", "--port", str(port)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    app = AppContext.from_settings(home)
    try:
        _wait_health(port, process)
        yield f"http://127.0.0.1:{port}", app
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            out, _ = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
        app.close()
        assert process.returncode == 0, out.decode(errors="replace")[-3000:]
    # serve stopped its worker: nothing of ours is left running
    leftover = subprocess.run(["pgrep", "-f", str(home)], capture_output=True, text=True).stdout.split()
    assert leftover == [], leftover


def _ready_engines(app: AppContext, count: int, timeout: float = 120) -> list[EngineRecord]:
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
        time.sleep(0.5)
    raise AssertionError(f"engines did not get READY: {[(j.id, j.status, j.phase, j.error) for j in jobs]}")


def test_upload_build_verify_and_charts_in_chromium(served: tuple[str, AppContext], tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, app = served
    model = shared_model("mobilenet_v3_small.onnx")
    shots = tmp_path / "screenshots"
    shots.mkdir()
    extra = os.environ.get("ENGINECACHE_SCREENSHOTS")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport=VIEWPORT)
        page.set_default_timeout(TIMEOUT_MS)

        def goto_until(path: str, text: str, timeout: float = 20) -> None:
            """Open a page, reloading until `text` shows (lists are cached for a few seconds)."""
            deadline = time.monotonic() + timeout
            while True:
                page.goto(f"{url}{path}")
                try:
                    expect(page.get_by_text(text).first).to_be_visible(timeout=3000)
                    return
                except AssertionError:
                    if time.monotonic() > deadline:
                        raise

        def shot(name: str) -> None:
            page.wait_for_timeout(800)  # let plotly finish drawing
            path = shots / f"{name}.png"
            page.screenshot(path=str(path))
            if extra:
                Path(extra).mkdir(parents=True, exist_ok=True)
                shutil.copy(path, Path(extra) / path.name)

        # Models: upload, see it registered with its digest and dynamic dims
        page.goto(f"{url}/models")
        expect(page.get_by_role("heading", name="Models", exact=True)).to_be_visible()
        page.locator("input[type=file]").first.set_input_files(str(model))
        register = page.get_by_role("button", name="Register upload")
        expect(register).to_be_enabled()
        register.click()
        expect(page.get_by_text("Registered: mobilenet_v3_small")).to_be_visible(timeout=TIMEOUT_MS)
        expect(page.get_by_text("Lineage")).to_be_visible()

        # Build: two precisions for one target, live progress
        page.goto(f"{url}/build")
        submit = page.get_by_role("button", name="Submit 2 build(s)")
        expect(submit).to_be_enabled()
        submit.click()
        expect(page.get_by_text("queued job").first).to_be_visible()
        expect(page.locator("[data-testid='stProgress']").first).to_be_visible()
        shot("build")
        engines = _ready_engines(app, 2)
        assert sorted(e.precision for e in engines) == ["fp16", "fp32"]
        expect(page.get_by_text(f"engine {engines[-1].id} READY").first).to_be_visible(timeout=TIMEOUT_MS)

        # Models again, now with the fp16 variant, its lineage and the op histogram
        goto_until("/models", "Models (2)")
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
        expect(page.get_by_text("built for sm86 with tensorrt_rtx").first).to_be_visible()
        shot("engines")
        with app.catalog.read() as session:
            verified = session.get(EngineRecord, engine.id)
        assert verified is not None and verified.verified_at is not None

        # Timings: the charts are drawn
        page.goto(f"{url}/timings")
        expect(page.get_by_text("Build time by model, target and precision")).to_be_visible()
        expect(page.locator(".js-plotly-plot").first).to_be_visible()
        assert page.locator(".js-plotly-plot").count() >= 2
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
