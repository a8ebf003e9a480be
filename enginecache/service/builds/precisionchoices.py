"""Which precisions a build form offers for the backends its targets use: those this install can make
for at least one of them (`core.precision.availability.missing_tool`, the answer planning refuses
by), and for each one it cannot make for any of them, why (the extra to install).

A precision offered for one backend and not another (int8 for ONNX Runtime, not for TensorRT-RTX,
without ModelOpt) stays offered: its cells for the other backend are refused when planned, with the
same words, so the matrix shows them as errors rather than new builds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from enginecache.core.backends.registry import all_backends, get_backend
from enginecache.core.precision.availability import missing_tool
from enginecache.core.precision.spec import PRECISIONS


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str
    reason: str | None  # why no backend asked for can be given it here; None: offered


def precision_choices(backends: Sequence[str] = ()) -> list[PrecisionChoice]:
    """Every precision in order, each offered (reason None) where this install can make it for one
    of `backends` (default: every backend), else with the first backend's reason."""
    families = [get_backend(name).precision_family for name in backends] or [b.precision_family for b in all_backends()]
    choices = []
    for precision in PRECISIONS:
        reasons = [missing_tool(precision, family) for family in families]
        choices.append(PrecisionChoice(precision, None if None in reasons else reasons[0]))
    return choices


def cannot_make(precision: str, backend: str) -> str | None:
    """Why this install cannot make `precision` for `backend` (the extra to install), None where it can:
    the answer planning refuses a build by, for one cell of a matrix."""
    return missing_tool(precision, get_backend(backend).precision_family)
