"""What the browser tests share about Playwright itself (tests/servekit.py: the server they open).
Importing it skips the importing module where Playwright is not installed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.servekit import TIMEOUT_MS

if TYPE_CHECKING:
    from playwright.sync_api import Locator

expect = pytest.importorskip("playwright.sync_api").expect
EXPECT_DEFAULT_MS = 5_000  # Playwright's own default for expect()


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
    still fails."""
    expect(locator).to_have_count(1, timeout=timeout_ms)
    expect(locator).to_be_visible(timeout=timeout_ms)
