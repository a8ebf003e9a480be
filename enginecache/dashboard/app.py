"""The enginecache dashboard: `streamlit run enginecache/dashboard/app.py` (or `enginecache serve`).

An `st.navigation` router over one module per view. Views read the catalog through the service
layer and enqueue jobs; no engine is built or loaded in this process.

A view's module (and the dashboard's data layer) is imported when a view first runs, not when the
router does: the first page a new server process renders (Overview) then imports what it uses
(pandas, plotly's graph objects, the catalog and its read models) and not what Build and Engines
need (build planning, precision recipes, ONNX inspection, plotly express), which a server process
pays only if those views are opened.
"""

from __future__ import annotations

import importlib
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

logger = logging.getLogger(__name__)

VIEWS_PACKAGE = "enginecache.dashboard.views"

# (view module under enginecache.dashboard.views, title, url path, icon); the first is the default page.
VIEWS: tuple[tuple[str, str, str, str], ...] = (
    ("overview", "Overview", "overview", ":material/dashboard:"),
    ("models", "Models", "models", ":material/deployed_code:"),
    ("build", "Build", "build", ":material/construction:"),
    ("engines", "Engines", "engines", ":material/memory:"),
    ("timings", "Timings", "timings", ":material/timer:"),
    ("hosts", "Hosts", "hosts", ":material/dns:"),
)


def view_render(module: str) -> Callable[[], None]:
    """The view's `render`, its module imported on the first call."""

    def render() -> None:
        importlib.import_module(f"{VIEWS_PACKAGE}.{module}").render()

    render.__module__ = f"{VIEWS_PACKAGE}.{module}"
    return render


def guarded(render: Callable[[], None]) -> Callable[[], None]:
    """Run a view; an unexpected error is shown with its reason, never as a traceback."""

    def run() -> None:
        try:
            render()
        except Exception as err:  # noqa: BLE001 - shown to the operator with its reason
            from enginecache.dashboard.data import show_error

            show_error(err, "this view failed")

    run.__name__ = render.__module__.rsplit(".", 1)[-1]
    return run


def main() -> None:
    st.set_page_config(page_title="enginecache", page_icon=":material/memory:", layout="wide")
    # Streamlit's first element in a process walks the stack and maps every loaded module to its
    # file (its REPL check): emitted before a view imports pandas and SQLAlchemy, that is cheap.
    st.sidebar.caption("enginecache: build TensorRT engines once, load them in milliseconds.")
    pages = [
        st.Page(guarded(view_render(module)), title=title, url_path=path, icon=icon, default=index == 0)
        for index, (module, title, path, icon) in enumerate(VIEWS)
    ]
    st.navigation(pages).run()


if __name__ == "__main__":
    main()
