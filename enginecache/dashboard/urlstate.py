"""Filters kept in the URL (`st.query_params`), so a link reproduces the view: a widget whose
session has no value yet takes the URL's (`from_url`, before the widget is drawn); once drawn, its
value is written back (`to_url`), and a default value leaves the URL."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import streamlit as st


def url_int(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def url_text(text: str) -> str | None:
    return text or None


def from_url(
    key: str, param: str, parse: Callable[[str], Any] = url_text, allowed: Collection[Any] | None = None
) -> None:
    """Before widget `key` is drawn: where this session has no value for it, the URL's `param`
    (parsed; a value that does not parse, or is not among `allowed`, is left out)."""
    if key in st.session_state or param not in st.query_params:
        return
    value = parse(st.query_params[param])
    if value is not None and (allowed is None or value in allowed):
        st.session_state[key] = value


def to_url(param: str, value: Any) -> None:
    """The widget's value into the URL: None, "" and the "any" choice remove `param`."""
    text = "" if value is None else str(value).strip()
    if not text:
        if param in st.query_params:
            del st.query_params[param]
    elif st.query_params.get(param) != text:
        st.query_params[param] = text
