"""Which converters can run here, found without importing them (ModelOpt imports torch)."""

from __future__ import annotations

from enginecache.core.lazyimport import importable

MODELOPT_MODULES = ("modelopt", "torch", "onnx_graphsurgeon")  # what AutoCast imports


def modelopt_available() -> bool:
    """Whether ModelOpt AutoCast can be imported here (checked without importing it or torch)."""
    return all(importable(name) for name in MODELOPT_MODULES)
