"""Model inputs for test-loads and calibration: the profile's shapes, generated feeds, or an .npz.

`generate_feed` is the one generator of stand-in inputs; test-load (`random_inputs`) and random
calibration (`core.calibration.random_batches`) both draw from it, so both feed a model the same
kind of values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from enginecache.core.backends.base import TensorIO, numpy_dtype
from enginecache.errors import BadInputError, TestInputError


@dataclass(frozen=True)
class InputSlot:
    """One input to generate: its name, numpy dtype and concrete shape."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]


def generate_feed(
    slots: Sequence[InputSlot], rng: np.random.Generator, error: type[BadInputError] = TestInputError
) -> dict[str, np.ndarray]:
    """Floats ~ N(0, 1); booleans and integer `*mask*` inputs all ones; other integers in [0, 100).
    An input of another kind (strings, complex) raises `error` naming it."""
    feed: dict[str, np.ndarray] = {}
    for slot in slots:
        kind = slot.dtype.kind
        if kind == "f":
            feed[slot.name] = rng.standard_normal(slot.shape).astype(slot.dtype)
        elif kind == "b" or (kind in "iu" and "mask" in slot.name.lower()):
            feed[slot.name] = np.ones(slot.shape, dtype=slot.dtype)
        elif kind in "iu":
            feed[slot.name] = rng.integers(0, 100, size=slot.shape).astype(slot.dtype)
        else:
            raise error(f"model input '{slot.name}' of type {slot.dtype} cannot be fed generated data")
    return feed


def input_shapes(
    profiles: Mapping[str, Mapping[str, Sequence[int]]], io: Sequence[TensorIO], batch: int | None = None
) -> dict[str, tuple[int, ...]]:
    """The profile's opt shape of every input; `batch` replaces dim 0 where the profile lets it vary."""
    shapes: dict[str, tuple[int, ...]] = {}
    for tensor in io:
        if tensor.mode != "input":
            continue
        profile = profiles.get(tensor.name)
        if profile is not None:
            shape = [int(d) for d in profile["opt"]]
        elif all(isinstance(d, int) and d >= 0 for d in tensor.shape):
            shape = [int(d) for d in tensor.shape]
        else:
            raise TestInputError(f"input {tensor.name} has dynamic dims {list(tensor.shape)} and no profile")
        if batch is not None:
            if not shape:
                raise TestInputError(f"input {tensor.name} is a scalar: it has no batch dim")
            low, high = (profile["min"][0], profile["max"][0]) if profile is not None else (shape[0], shape[0])
            if not low <= batch <= high:
                raise TestInputError(f"batch {batch} is outside input {tensor.name}'s profile range {low}..{high}")
            shape[0] = batch
        shapes[tensor.name] = tuple(shape)
    return shapes


def random_inputs(io: Sequence[TensorIO], shapes: Mapping[str, tuple[int, ...]], *, seed: int = 0) -> dict[str, Any]:
    """Deterministic inputs for an engine's inputs at `shapes` (see `generate_feed`)."""
    slots = [InputSlot(t.name, numpy_dtype(t.dtype), shapes[t.name]) for t in io if t.mode == "input"]
    return generate_feed(slots, np.random.default_rng(seed), TestInputError)


def load_inputs(path: Path, io: Sequence[TensorIO]) -> dict[str, Any]:
    """Inputs from an .npz keyed by input name; every engine input must be there."""
    try:
        with np.load(path) as data:
            feeds = {name: np.asarray(data[name]) for name in data.files}
    except (OSError, ValueError) as err:
        raise TestInputError(f"cannot read inputs from {path}: {err}") from err
    wanted = [t.name for t in io if t.mode == "input"]
    missing = [name for name in wanted if name not in feeds]
    if missing:
        raise TestInputError(f"{path.name} lacks input(s) {', '.join(missing)}; it has {', '.join(feeds) or 'none'}")
    return {name: feeds[name] for name in wanted}
