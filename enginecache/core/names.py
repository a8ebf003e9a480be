"""Model names: the pattern they must match, and a safe name made from a file name.

A model name is 1 to 128 characters of letters, digits, `.`, `_` and `-`, not starting with `.`
(so never `.` or `..`, never a path, never a control character or markup): names become folder
names in `export --format tree` and Triton repositories, and are printed in terminals and the
dashboard. Converted variants append `.<precision>` to their source's name and so match too.
"""

from __future__ import annotations

import re

from enginecache.errors import ModelNameError

NAME_MAX = 128
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")
NAME_RULE = "1-128 characters of letters, digits, '.', '_' and '-', not starting with '.'"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def check_model_name(name: str) -> str:
    """`name` when it matches the pattern; otherwise ModelNameError naming the rule (and never
    echoing control characters: the name is shown with repr)."""
    if NAME_PATTERN.fullmatch(name) is None:
        raise ModelNameError(f"model name {name!r} is not allowed: use {NAME_RULE}")
    return name


def name_from_filename(stem: str) -> str:
    """A valid name made from a file's stem: unsafe runs become `_`, leading dots go, at most 128
    characters; `model` where nothing usable is left."""
    cleaned = _UNSAFE.sub("_", stem).lstrip(".")[:NAME_MAX].strip("_") or "model"
    return check_model_name(cleaned)
