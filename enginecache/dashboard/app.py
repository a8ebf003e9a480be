"""The enginecache dashboard: `streamlit run enginecache/dashboard/app.py` (or `enginecache serve`).

An `st.navigation` router over one module per view. Views read the catalog through the service
layer and enqueue jobs; no engine is built or loaded in this process.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

# `streamlit run .../enginecache/dashboard/app.py` puts the dashboard folder (not the one holding the
# `enginecache` package) on sys.path.
_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import streamlit as st  # noqa: E402

from enginecache.dashboard.data import show_error  # noqa: E402
from enginecache.dashboard.views import build, engines, hosts, models, overview, timings  # noqa: E402

logger = logging.getLogger(__name__)

# (render function, title, url path, icon); the first is the default page.
VIEWS: tuple[tuple[Callable[[], None], str, str, str], ...] = (
    (overview.render, "Overview", "overview", ":material/dashboard:"),
    (models.render, "Models", "models", ":material/deployed_code:"),
    (build.render, "Build", "build", ":material/construction:"),
    (engines.render, "Engines", "engines", ":material/memory:"),
    (timings.render, "Timings", "timings", ":material/timer:"),
    (hosts.render, "Hosts", "hosts", ":material/dns:"),
)


def guarded(render: Callable[[], None]) -> Callable[[], None]:
    """Run a view; an unexpected error is shown with its reason, never as a traceback."""

    def run() -> None:
        try:
            render()
        except Exception as err:  # noqa: BLE001 - shown to the operator with its reason
            show_error(err, "this view failed")

    run.__name__ = render.__module__.rsplit(".", 1)[-1]
    return run


def main() -> None:
    st.set_page_config(page_title="enginecache", page_icon=":material/memory:", layout="wide")
    pages = [
        st.Page(guarded(render), title=title, url_path=path, icon=icon, default=index == 0)
        for index, (render, title, path, icon) in enumerate(VIEWS)
    ]
    page = st.navigation(pages)
    st.sidebar.caption("enginecache: build TensorRT engines once, load them in milliseconds.")
    page.run()


if __name__ == "__main__":
    main()
