"""Model inputs for test-loads and calibration: the profile's shapes, generated feeds, or an .npz.

`generate_feed` is the one generator of stand-in inputs; test-load (`random_inputs`) and random
calibration (`core.calibration.random_batches`) both draw from it, so both feed a model the same
kind of values. What it generates for an input follows what the model's graph says about it
(`read_input_hints`, from the ONNX file without its weights), then the input's name and dtype:

1. A scalar (or one-element) input compared with `Equal` against constants (directly or through
   Cast, Reshape, Unsqueeze, ...; `If` conditions included, e.g. silero-VAD's `sr` with 8000 and
   16000) takes the first of those values, in graph order.
2. Integer `*mask*` inputs, bool inputs and float `*mask*` inputs: all ones (True).
3. Integer `*token_type*` / `*segment*` inputs: zeros.
4. Integer `*position*` inputs: 0, 1, 2, ... along the last axis.
5. Integer inputs used as `Gather` indices (directly or through Cast, Unsqueeze, Reshape, ...):
   uniform in [0, n), n the smallest size, along the Gather's axis, of the tables they index (the
   Gather's data: an initializer or Constant, possibly behind Cast or DequantizeLinear).
   ONNX Runtime's fused `EmbedLayerNormalization` counts as a Gather of its embedding tables.
   Rules 2-4 are clipped to that bound too (a 1-row table gets zeros).
6. Other integers: uniform in [0, 100) (`DEFAULT_INT_HIGH`), within the dtype's range.
7. Other floats: N(0, 1).

Shapes are given (the profile's opt shapes, `input_shapes`). Before anything is allocated, a feed
whose inputs would not fit is refused with the bytes it would need: any one input over
`MAX_INPUT_BYTES` (4 GiB), or the whole feed over `MEMORY_FRACTION` (half) of the memory this
host has available.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from enginecache.core.backends.base import TensorIO, numpy_dtype
from enginecache.core.input_hints import MAX_CHOICES, InputHint, read_input_hints
from enginecache.errors import BadInputError, TestInputError

__all__ = [
    "DEFAULT_INT_HIGH",
    "MAX_CHOICES",
    "MAX_INPUT_BYTES",
    "MEMORY_FRACTION",
    "InputHint",
    "InputSlot",
    "ValueRule",
    "check_feed_size",
    "engine_slots",
    "feed_rules",
    "generate_feed",
    "input_shapes",
    "load_inputs",
    "random_inputs",
    "read_input_hints",
    "value_rule",
]

if TYPE_CHECKING:  # onnx is imported only when a model is read
    import onnx

MAX_INPUT_BYTES = 4 * 1024**3
"""The largest single generated input (bytes); a larger declared shape is refused up front."""

MEMORY_FRACTION = 0.5
"""The share of this host's available memory (MemAvailable) one generated feed may take."""

DEFAULT_INT_HIGH = 100
"""Integers with no range evident in the graph are drawn from [0, DEFAULT_INT_HIGH)."""

_MASK = re.compile(r"mask", re.IGNORECASE)
_TOKEN_TYPE = re.compile(r"token_?type|segment", re.IGNORECASE)
_POSITION = re.compile(r"position", re.IGNORECASE)


@dataclass(frozen=True)
class InputSlot:
    """One input to generate: its name, numpy dtype and concrete shape."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Bytes the input takes (exact, in Python ints: no overflow for absurd shapes)."""
        return math.prod(int(d) for d in self.shape) * int(self.dtype.itemsize)


@dataclass(frozen=True)
class ValueRule:
    """How one input's values are generated (see the module docstring for the rules)."""

    kind: str  # "choice" | "ones" | "zeros" | "positions" | "integers" | "normal"
    why: str
    low: int = 0
    high: int = 0  # exclusive; for "positions" the clip (0 = none)
    value: int | float | None = None

    def describe(self) -> str:
        if self.kind == "choice":
            return f"{self.value} ({self.why})"
        if self.kind == "integers":
            return f"integers in [{self.low}, {self.high}) ({self.why})"
        if self.kind == "positions":
            return f"0, 1, 2, ... along the last axis ({self.why})"
        if self.kind == "normal":
            return f"N(0, 1) ({self.why})"
        return f"all {self.kind} ({self.why})"


# -- what the graph says ---------------------------------------------------------------------
# -- generating ----------------------------------------------------------------------------


def _available_memory() -> int | None:
    """MemAvailable from /proc/meminfo (bytes), or None where there is none."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _gib(nbytes: int) -> str:
    return f"{nbytes / 1024**3:.3g} GiB"


def check_feed_size(slots: Sequence[InputSlot], error: type[BadInputError] = TestInputError) -> None:
    """Refuse, before allocating, a feed with an input over MAX_INPUT_BYTES or a total over
    MEMORY_FRACTION of the available memory; the message names the input, its shape and bytes."""
    for slot in slots:
        if slot.nbytes > MAX_INPUT_BYTES:
            raise error(
                f"input '{slot.name}' of shape {list(slot.shape)} ({slot.dtype}) would need {slot.nbytes} bytes "
                f"({_gib(slot.nbytes)}); generated inputs are limited to {MAX_INPUT_BYTES} bytes "
                f"({_gib(MAX_INPUT_BYTES)}) each: lower the profile's opt shape or pass an inputs file"
            )
    total = sum(slot.nbytes for slot in slots)
    available = _available_memory()
    if available is not None and total > MEMORY_FRACTION * available:
        largest = max(slots, key=lambda s: s.nbytes)
        raise error(
            f"the generated inputs would need {total} bytes ({_gib(total)}), more than {MEMORY_FRACTION:.0%} of "
            f"the {available} bytes ({_gib(available)}) available here; the largest is '{largest.name}' of shape "
            f"{list(largest.shape)} ({largest.dtype}, {largest.nbytes} bytes)"
        )


def _clip(rule: ValueRule, bound: int | None, tables: tuple[str, ...]) -> ValueRule:
    """A name rule's value kept inside a Gather bound (ones into a 1-row table become zeros)."""
    if bound is None:
        return rule
    where = f"; indexes {', '.join(tables)} with {bound} rows"
    if rule.kind == "ones" and bound < 2:
        return ValueRule("zeros", rule.why + where)
    if rule.kind == "positions":
        return ValueRule("positions", rule.why + where, high=bound)
    return rule


def value_rule(slot: InputSlot, hint: InputHint | None, error: type[BadInputError] = TestInputError) -> ValueRule:
    """The rule (module docstring) that generates one input's values."""
    kind = slot.dtype.kind
    if kind not in "fiub":
        raise error(f"model input '{slot.name}' of type {slot.dtype} cannot be fed generated data")
    hint = hint or InputHint()
    bound = hint.index_bound if kind in "iu" else None
    if hint.choices and math.prod(slot.shape) == 1:
        for choice in hint.choices:
            value = _fit(choice, slot.dtype, bound)
            if value is not None:
                others = [c for c in hint.choices if c != choice]
                also = f"; also valid: {', '.join(str(c) for c in others)}" if others else ""
                return ValueRule("choice", f"compared with Equal in the graph{also}", value=value)
    if kind == "b":
        return ValueRule("ones", "bool input")
    if _MASK.search(slot.name):
        return _clip(ValueRule("ones", "a mask"), bound, hint.tables)
    if kind == "f":
        return ValueRule("normal", "float input")
    if _TOKEN_TYPE.search(slot.name):
        return ValueRule("zeros", "token-type ids")
    if _POSITION.search(slot.name):
        return _clip(ValueRule("positions", "position ids"), bound, hint.tables)
    info = np.iinfo(slot.dtype)
    if bound is not None:
        high = min(bound, int(info.max) + 1)
        return ValueRule("integers", f"Gather indices into {', '.join(hint.tables)}", low=0, high=high)
    return ValueRule("integers", "no range in the graph", low=0, high=min(DEFAULT_INT_HIGH, int(info.max) + 1))


def _fit(choice: int | float, dtype: np.dtype[Any], bound: int | None) -> int | float | None:
    """`choice` as a value of `dtype`, or None where it does not fit (or breaks the Gather bound)."""
    if dtype.kind == "f":
        return float(choice)
    if dtype.kind == "b":
        return None
    if float(choice) != int(choice):
        return None
    value = int(choice)
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max or (bound is not None and not 0 <= value < bound):
        return None
    return value


def _generate(slot: InputSlot, rule: ValueRule, rng: np.random.Generator) -> np.ndarray:
    if rule.kind == "choice":
        return np.full(slot.shape, rule.value, dtype=slot.dtype)
    if rule.kind == "ones":
        return np.ones(slot.shape, dtype=slot.dtype)
    if rule.kind == "zeros":
        return np.zeros(slot.shape, dtype=slot.dtype)
    if rule.kind == "positions":
        length = slot.shape[-1] if slot.shape else 1
        positions = np.arange(length, dtype=np.int64)
        if rule.high:
            positions = np.minimum(positions, rule.high - 1)
        return np.broadcast_to(positions, slot.shape).astype(slot.dtype)
    if rule.kind == "integers":
        return rng.integers(rule.low, rule.high, size=slot.shape).astype(slot.dtype)
    return rng.standard_normal(slot.shape).astype(slot.dtype)


def feed_rules(
    slots: Sequence[InputSlot],
    hints: Mapping[str, InputHint] | None = None,
    error: type[BadInputError] = TestInputError,
) -> dict[str, ValueRule]:
    """The rule for every slot (what a test-load records as how its inputs were made)."""
    hints = hints or {}
    return {slot.name: value_rule(slot, hints.get(slot.name), error) for slot in slots}


def generate_feed(
    slots: Sequence[InputSlot],
    rng: np.random.Generator,
    error: type[BadInputError] = TestInputError,
    hints: Mapping[str, InputHint] | None = None,
) -> dict[str, np.ndarray]:
    """One feed of generated inputs by the module's rules (`hints` from `read_input_hints`; without
    them only the name and dtype rules apply). An input of another kind (strings, complex) or too
    large to allocate raises `error` naming it."""
    rules = feed_rules(slots, hints, error)
    check_feed_size(slots, error)
    feed: dict[str, np.ndarray] = {}
    for slot in slots:
        try:
            feed[slot.name] = _generate(slot, rules[slot.name], rng)
        except MemoryError as err:
            raise error(
                f"input '{slot.name}' of shape {list(slot.shape)} ({slot.dtype}, {slot.nbytes} bytes) "
                f"could not be allocated: {err}"
            ) from err
    return feed


# -- shapes, test-load feeds, inputs files ---------------------------------------------------


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


def engine_slots(io: Sequence[TensorIO], shapes: Mapping[str, tuple[int, ...]]) -> list[InputSlot]:
    return [InputSlot(t.name, numpy_dtype(t.dtype), shapes[t.name]) for t in io if t.mode == "input"]


def random_inputs(
    io: Sequence[TensorIO],
    shapes: Mapping[str, tuple[int, ...]],
    *,
    seed: int = 0,
    model: Path | onnx.ModelProto | None = None,
    hints: Mapping[str, InputHint] | None = None,
) -> dict[str, Any]:
    """Deterministic inputs for an engine's inputs at `shapes` (see `generate_feed`), following what
    `model` (the engine's source ONNX) or `hints` say about them."""
    if hints is None and model is not None:
        hints = read_input_hints(model, TestInputError)
    return generate_feed(engine_slots(io, shapes), np.random.default_rng(seed), TestInputError, hints)


def load_inputs(path: Path, io: Sequence[TensorIO]) -> dict[str, Any]:
    """Inputs from an .npz keyed by input name; every engine input must be there."""
    try:
        with np.load(path) as data:
            feeds = {name: np.asarray(data[name]) for name in data.files}
    except (OSError, ValueError, MemoryError) as err:
        raise TestInputError(f"cannot read inputs from {path}: {err}") from err
    wanted = [t.name for t in io if t.mode == "input"]
    missing = [name for name in wanted if name not in feeds]
    if missing:
        raise TestInputError(f"{path.name} lacks input(s) {', '.join(missing)}; it has {', '.join(feeds) or 'none'}")
    return {name: feeds[name] for name in wanted}
