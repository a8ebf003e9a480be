"""The dashboard offline and branded (issue 12): a page title and an icon drawn here (no font CDN
for the favicon) before anything renders; every view at its own url path, `/overview` included;
shapes written as people read them."""

from __future__ import annotations

from ast import literal_eval
from typing import Any

import pytest
import streamlit
from PIL import Image
from streamlit.testing.v1 import AppTest

from enginecache.dashboard import app as dashboard_app
from enginecache.dashboard.branding import page_icon
from tests.dashboardkit import Seeded, frame, router, view


def test_the_page_config_comes_first_with_a_local_icon(seeded: Seeded, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    real = streamlit.set_page_config

    def spy(**kwargs: Any) -> None:
        calls.append(kwargs)
        real(**kwargs)

    monkeypatch.setattr(dashboard_app.st, "set_page_config", spy)
    at = router().run()
    assert not at.exception
    [config] = calls
    assert config["page_title"] == "enginecache"
    icon = config["page_icon"]
    assert isinstance(icon, Image.Image) and icon is page_icon(), "an image served by this server, no CDN"


PAGES_SCRIPT = """
import streamlit as st
from enginecache.dashboard import app
home, pages = app.view_pages(list(app.VIEWS))
st.text(repr((home.url_path, home.visibility, [p.url_path for p in pages], [p.visibility for p in pages])))
"""


def test_every_view_has_its_own_url_path_the_first_one_too(seeded: Seeded) -> None:
    at = AppTest.from_string(PAGES_SCRIPT, default_timeout=60).run()
    home, visibility, paths, shown = literal_eval(at.text[0].value)
    assert home == "" and visibility == "hidden", "the root draws the Overview, not listed twice"
    assert paths == [path for _, _, path, _ in dashboard_app.VIEWS] and paths[0] == "overview"
    assert set(shown) == {"visible"}, "/overview opens the Overview (no 'Page not found')"
    at = router().run()
    assert not at.exception and at.title[0].value == "Overview"


def test_shapes_read_as_people_write_them_on_build_and_engines(seeded: Seeded) -> None:
    at = view("build").run()
    assert frame(at, "input", "shape", "min").loc[0, "shape"] == "batch x 3 x 32 x 32"
    at = view("engines").run()
    io = frame(at, "name", "shape", "mode")
    assert "x 3 x 32 x 32" in io.loc[0, "shape"] and "[" not in io.loc[0, "shape"]
