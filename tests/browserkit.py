"""What the browser tests share about Playwright itself (tests/servekit.py: the server they open):
Chromium launched with its flags, a page with the generous limits, waiting for a Streamlit run
and its charts, and the dashboard steps several tests take (an upload registered, builds
submitted). Importing it skips the importing module where Playwright is not installed."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.servekit import CHROMIUM, CHROMIUM_ARGS, TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator, Page, Playwright

expect = pytest.importorskip("playwright.sync_api").expect
EXPECT_DEFAULT_MS = 5_000  # Playwright's own default for expect()
VIEWPORT = {"width": 1440, "height": 1600}


@pytest.fixture(autouse=True)
def generous_expect() -> Iterator[None]:
    """expect() waits up to TIMEOUT_MS like every other Playwright call (its own default is 5 s);
    autouse in every module that imports it."""
    expect.set_options(timeout=TIMEOUT_MS)
    yield
    expect.set_options(timeout=EXPECT_DEFAULT_MS)


def expect_once(locator: Locator, timeout_ms: float | None = None) -> None:
    """Until the page shows `locator` exactly once, and visibly. While a rerun redraws a section
    (a live fragment that ends by rerunning the page), Streamlit keeps the stale copy beside the new
    one until the run ends; a plain expect() on a locator that matches both fails at once on
    Playwright's strict mode, while a count waits for the stale copy to go. A duplicate that stays
    still fails. The visibility is asked of the first match: another rerun may start between the two
    checks and draw a stale copy again, which the last count waits out."""
    expect(locator).to_have_count(1, timeout=timeout_ms)
    expect(locator.first).to_be_visible(timeout=timeout_ms)
    expect(locator).to_have_count(1, timeout=timeout_ms)


def launch(playwright: Playwright) -> Browser:
    """Headless Debian Chromium with the flags the browser tests run it with."""
    return playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)


def open_page(browser: Browser) -> Page:
    """A page of VIEWPORT whose every action and navigation waits up to TIMEOUT_MS."""
    page = browser.new_page(viewport=VIEWPORT)
    page.set_default_timeout(TIMEOUT_MS)
    page.set_default_navigation_timeout(TIMEOUT_MS)
    return page


def wait_for_app_run(page: Page) -> None:
    """Until the script run ended and every element rendered (what Streamlit's own e2e suite waits
    for): the websocket is connected, the script is not running, no skeleton is left."""
    page.locator("[data-testid='stApp'][data-test-connection-state='CONNECTED']").wait_for(state="attached")
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(state="attached")
    expect(page.get_by_test_id("stSkeleton")).to_have_count(0)


def wait_for_charts(page: Page) -> None:
    """Until every plotly chart on the page has drawn its SVG."""
    for chart in page.locator(".js-plotly-plot").all():
        expect(chart.locator(".main-svg").first).to_be_visible()


def register_upload(page: Page, model: Path) -> None:
    """On the Models view: upload `model` and register it, until it is shown registered under its stem.
    The form is drawn first (its button disabled without a file), so the file goes to this run's uploader."""
    register = page.get_by_role("button", name="Register upload")
    expect(register).to_be_visible()
    page.locator("input[type=file]").first.set_input_files(str(model))
    expect(register).to_be_enabled()
    register.click()
    expect(page.get_by_text(f"Registered: {model.stem}")).to_be_visible()


def submit_builds(page: Page, count: int) -> None:
    """On the Build view: submit `count` builds, until the job list (above the form, from the
    catalog) shows a card per job, QUEUED or RUNNING by now."""
    submit = page.get_by_role("button", name=f"Submit {count} build(s)")
    expect(submit).to_be_enabled()
    submit.click()
    expect(page.get_by_text("queued job").first).to_be_visible()
    expect(page.get_by_text(re.compile(r"· (QUEUED|RUNNING|SUCCEEDED)")).first).to_be_visible()
