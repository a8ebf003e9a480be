"""What the browser tests share about Playwright itself (tests/servekit.py: the server they open).
Importing it skips the importing module where Playwright is not installed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.servekit import TIMEOUT_MS

expect = pytest.importorskip("playwright.sync_api").expect
EXPECT_DEFAULT_MS = 5_000  # Playwright's own default for expect()


@pytest.fixture(autouse=True)
def generous_expect() -> Iterator[None]:
    """expect() waits up to TIMEOUT_MS like every other Playwright call (its own default is 5 s);
    autouse in every module that imports it."""
    expect.set_options(timeout=TIMEOUT_MS)
    yield
    expect.set_options(timeout=EXPECT_DEFAULT_MS)
