"""Accuracy tolerances: the thresholds `core.accuracy` judges an engine's outputs by, per precision.

A precision's defaults (`DEFAULT_TOLERANCES`; docs/runtime.md explains them) can be overridden for
every output or for one named output (`tolerances_for`), as Polygraphy's `--atol out:value` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from enginecache.errors import TestInputError

_TOLERANCE_NAMES = ("atol", "rtol", "min_cosine", "min_top1", "min_top5")


@dataclass(frozen=True)
class Tolerances:
    """The thresholds of `core.accuracy`'s three rules; `per_output` overrides some of them
    for named outputs (Polygraphy's `--atol out:value`)."""

    atol: float
    rtol: float
    min_cosine: float
    min_top1: float = 0.99
    min_top5: float = 0.99
    per_output: Mapping[str, Mapping[str, float]] = field(default_factory=dict)

    def for_output(self, name: str) -> Tolerances:
        overrides = self.per_output.get(name)
        return replace(self, per_output={}, **dict(overrides)) if overrides else self

    def to_dict(self) -> dict[str, Any]:
        values: dict[str, Any] = {name: getattr(self, name) for name in _TOLERANCE_NAMES}
        if self.per_output:
            values["per_output"] = {k: dict(v) for k, v in self.per_output.items()}
        return values


# Defaults per precision (docs/runtime.md explains them); override with `tolerances=`.
DEFAULT_TOLERANCES: dict[str, Tolerances] = {
    "fp32": Tolerances(atol=1e-4, rtol=1e-3, min_cosine=0.99999, min_top1=0.99, min_top5=0.99),
    "fp16": Tolerances(atol=1e-2, rtol=1e-2, min_cosine=0.999, min_top1=0.99, min_top5=0.99),
    "bf16": Tolerances(atol=5e-2, rtol=5e-2, min_cosine=0.995, min_top1=0.98, min_top5=0.98),
    "int8": Tolerances(atol=0.25, rtol=0.1, min_cosine=0.98, min_top1=0.95, min_top5=0.95),
    "fp8": Tolerances(atol=0.3, rtol=0.15, min_cosine=0.97, min_top1=0.9, min_top5=0.9),
}


def tolerances_for(precision: str, overrides: Mapping[str, float] | None = None) -> Tolerances:
    """A precision's defaults with `overrides`: `atol`, `rtol`, `min_cosine`, `min_top1`,
    `min_top5` for every output, or `NAME:OUTPUT` (e.g. `atol:boxes`) for one output."""
    base = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["fp32"])
    if not overrides:
        return base
    common: dict[str, float] = {}
    per_output: dict[str, dict[str, float]] = {}
    unknown = []
    for key, value in overrides.items():
        name, sep, output = key.partition(":")
        if name not in _TOLERANCE_NAMES or (sep and not output):
            unknown.append(key)
        elif output:
            per_output.setdefault(output, {})[name] = float(value)
        else:
            common[name] = float(value)
    if unknown:
        raise TestInputError(
            f"unknown tolerance(s) {', '.join(sorted(unknown))}: use {', '.join(_TOLERANCE_NAMES)} "
            "(or NAME:OUTPUT for one output)"
        )
    return replace(base, per_output=per_output, **common)
