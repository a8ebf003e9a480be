"""An address the dashboard has no page for says so (issue 28, point 14): Streamlit draws the
default page (Overview) for it, and the router adds one line naming the path; the root and a
view's own address say nothing."""

from __future__ import annotations

import pytest

from enginecache.dashboard.app import unknown_path
from tests.dashboardkit import Seeded, plain, router


@pytest.mark.parametrize(
    ("url", "warned"),
    [("http://localhost:8501/no-such-page", True), ("http://localhost:8501/", False), ("http://localhost:8501", False)],
)
def test_an_unknown_address_says_there_is_no_such_page(seeded: Seeded, url: str, warned: bool) -> None:
    at = router()
    at.context = {"url": url}
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Overview"
    warnings = [plain(w.value) for w in at.warning if "There is no page" in plain(w.value)]
    assert warnings == (["There is no page at /no-such-page: this is the Overview."] if warned else [])


def test_the_path_is_read_under_the_servers_base_path() -> None:
    known = ["overview", "engines"]
    assert unknown_path("https://h/ec/engines", known, "/ec") is None
    assert unknown_path("https://h/ec", known, "ec") is None
    assert unknown_path("https://h/ec/enignes", known, "ec") == "enignes"
    assert unknown_path(None, known, "") is None
