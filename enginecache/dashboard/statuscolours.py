"""One colour per engine and job status for the dashboard's tables (the word stays in every cell:
colour is never the only signal): done is green, under way blue, failed red, set aside grey."""

from __future__ import annotations

from typing import Any

_GREEN, _BLUE, _RED, _DARK_RED, _GREY = (
    ("#c8e6c9", "#1b5e20"),
    ("#bbdefb", "#0d47a1"),
    ("#ffcdd2", "#b71c1c"),
    ("#ef9a9a", "#7f0000"),
    ("#eeeeee", "#424242"),
)
STATUS_COLOURS: dict[str, tuple[str, str]] = {  # status -> (background, text)
    "READY": _GREEN,
    "SUCCEEDED": _GREEN,
    "PENDING": _BLUE,
    "QUEUED": _BLUE,
    "RUNNING": _BLUE,
    "FAILED": _RED,
    "DEAD": _RED,
    "CORRUPT": _DARK_RED,
    "RETIRED": _GREY,
    "CANCELLED": _GREY,
}


def status_style(value: Any) -> str:
    """The CSS for a status cell (pandas Styler.map); "" for anything that is no status."""
    colours = STATUS_COLOURS.get(str(value))
    return f"background-color: {colours[0]}; color: {colours[1]}" if colours else ""
