"""One colour per engine and job status for the dashboard's tables (the word stays in every cell:
colour is never the only signal): done is green, under way blue, failed red, set aside grey.

Two forms of it: CSS for a pandas Styler (`status_style`, the Engines table) and Streamlit's own
markdown badges (`status_badge`, the Overview's counts: a first view that imports no pandas)."""

from __future__ import annotations

from typing import Any

from enginecache.service.readmodels.display import markdown_literal

_GREEN, _BLUE, _RED, _DARK_RED, _GREY, _VIOLET = (
    ("#c8e6c9", "#1b5e20"),
    ("#bbdefb", "#0d47a1"),
    ("#ffcdd2", "#b71c1c"),
    ("#ef9a9a", "#7f0000"),
    ("#eeeeee", "#424242"),
    ("#e1bee7", "#4a148c"),
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
    "TAMPERED": _DARK_RED,  # its row no longer says what was signed (core.signing)
    "RETIRED": _GREY,
    "CANCELLED": _GREY,
    "UNPROVEN": _VIOLET,  # imported, no host has loaded it yet
}


# Streamlit's badge colours nearest each one (a badge has no dark red: a corrupt engine is orange).
_BADGES: dict[tuple[str, str], str] = {
    _GREEN: "green",
    _BLUE: "blue",
    _RED: "red",
    _DARK_RED: "orange",
    _GREY: "gray",
    _VIOLET: "violet",
}


def status_badge(status: str) -> str:
    """A status as a markdown badge of its colour (`:green-badge[READY]`); anything that is no status,
    as plain text."""
    colours = STATUS_COLOURS.get(status)
    return f":{_BADGES[colours]}-badge[{status}]" if colours else markdown_literal(status)


def status_style(value: Any) -> str:
    """The CSS for a status cell (pandas Styler.map); "" for anything that is no status."""
    colours = STATUS_COLOURS.get(str(value))
    return f"background-color: {colours[0]}; color: {colours[1]}" if colours else ""
