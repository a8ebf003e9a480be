"""What the dashboard offers a build with and explains one by: each backend as a `BackendChoice`
(name, label, what its engines run on, the targets it builds for from any host), `backend_label`,
the precisions (`PRECISIONS`; `QUANTIZED` ones need calibration data), a model's default build
profile (`default_profile`: one `ProfileRow` per input), and `diff_ingredients`, every cache-key
ingredient two keys differ in ("why was this a miss?", a list of `FieldDiff`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from enginecache.core.backends.registry import all_backends, backend_label
from enginecache.core.cachekey import FieldDiff, diff_ingredients
from enginecache.core.precision.spec import PRECISIONS, QUANTIZED
from enginecache.core.profiles import resolve_profile
from enginecache.core.shapetext import shape_text
from enginecache.service.context import AppContext
from enginecache.service.models.register import get_model, model_inputs

__all__ = [
    "PRECISIONS",
    "QUANTIZED",
    "BackendChoice",
    "FieldDiff",
    "ProfileRow",
    "backend_choices",
    "backend_label",
    "default_profile",
    "diff_ingredients",
]


@dataclass(frozen=True)
class BackendChoice:
    """A backend as a build form offers it."""

    name: str  # "rtx"
    label: str  # "TensorRT-RTX"
    device: str  # "gpu" | "cpu": what its engines run on
    known_targets: tuple[str, ...]  # what it builds for from any host; empty: the hardware it runs on


def backend_choices() -> tuple[BackendChoice, ...]:
    """Every backend, in the registry's order."""
    return tuple(BackendChoice(b.name, b.label, b.device, b.known_targets()) for b in all_backends())


class ProfileRow(TypedDict):
    """One input of a model's default build profile: its shape (dynamic dims named) and the
    min/opt/max a build uses unless told otherwise, each as `1x3x224x224`."""

    input: str
    shape: str
    min: str
    opt: str
    max: str


def default_profile(app: AppContext, model_id: int) -> list[ProfileRow]:
    """The default profile of the model's inputs (from their dynamic dims), one row per input."""
    inputs = model_inputs(get_model(app, model_id))
    shapes = {t.name: t.shape for t in inputs}
    return [
        ProfileRow(
            input=p.name,
            shape=shape_text(shapes.get(p.name, ())),
            min="x".join(str(d) for d in p.min),
            opt="x".join(str(d) for d in p.opt),
            max="x".join(str(d) for d in p.max),
        )
        for p in resolve_profile(inputs, {}).inputs
    ]
