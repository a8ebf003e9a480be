"""Which converters can run here, found without importing them (ModelOpt imports torch)."""

from __future__ import annotations

from enginecache.core.recipetools import MODELOPT_MODULES as MODELOPT_MODULES  # re-exported
from enginecache.core.recipetools import modelopt_importable


def modelopt_available() -> bool:
    """Whether ModelOpt AutoCast can be imported here (checked without importing it or torch):
    `core.recipetools.modelopt_importable`, which the serving memo keys by."""
    return modelopt_importable()
