"""Which converters can run here, found without importing them (ModelOpt imports torch)."""

from __future__ import annotations

import importlib.util


def modelopt_available() -> bool:
    """Whether ModelOpt AutoCast can be imported here (checked without importing it or torch)."""
    return all(importlib.util.find_spec(name) is not None for name in ("modelopt", "torch", "onnx_graphsurgeon"))
