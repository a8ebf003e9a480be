"""Use case: check an .npz of test-load inputs against an engine before it is queued.

The test-load reads inputs files with `core.inputs.load_inputs` (every engine input by name); this
reads the file the same way, then checks each array against the engine's input as the catalog
recorded it: its dtype, its rank, and each dimension within the engine's optimization profile
(min..max) or equal to a static one. Every problem is named in one TestInputError, so an operator
who uploads a file learns at once what to fix instead of from a failed job. What the engine takes
is `expected_inputs` (the dashboard shows it beside the uploader).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from enginecache.core.backends.base import TensorIO, numpy_dtype
from enginecache.core.inputs import load_inputs
from enginecache.errors import TestInputError
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.jobs.refs import engine_io


@dataclass(frozen=True)
class ExpectedInput:
    """One input an engine takes: its dtype, and per dimension the range its profile allows."""

    name: str
    dtype: str
    dims: tuple[tuple[int, int | None], ...]  # (min, max) per dim; max None: any size from min

    @property
    def shape_text(self) -> str:
        """'1..8 x 3 x 32 x 32': a range where the profile lets a dim vary."""
        parts = [str(lo) if lo == hi else f"{lo}..{'any' if hi is None else hi}" for lo, hi in self.dims]
        return " x ".join(parts) or "scalar"


@dataclass(frozen=True)
class CheckedInput:
    name: str
    dtype: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class InputsCheck:
    """What an inputs file holds for the engine: one entry per engine input, and the arrays it
    has that the engine does not take (a test-load leaves them out)."""

    inputs: tuple[CheckedInput, ...]
    ignored: tuple[str, ...] = ()


def _dims(tensor: TensorIO, profile: Mapping[str, Sequence[int]] | None) -> tuple[tuple[int, int | None], ...]:
    if profile is not None:
        return tuple((int(lo), int(hi)) for lo, hi in zip(profile["min"], profile["max"], strict=False))
    return tuple(
        (int(d), int(d)) if isinstance(d, int) and d >= 0 else (1, None)  # a dynamic dim without a profile
        for d in tensor.shape
    )


def expected_inputs(io: Sequence[TensorIO], profiles: Mapping[str, Mapping[str, Sequence[int]]]) -> list[ExpectedInput]:
    """The engine's inputs, in its order, with the dims its profile (else its static shape) allows."""
    return [
        ExpectedInput(t.name, str(numpy_dtype(t.dtype)), _dims(t, profiles.get(t.name)))
        for t in io
        if t.mode == "input"
    ]


def engine_expected_inputs(app: AppContext, engine_id: int) -> list[ExpectedInput]:
    engine = get_engine(app, engine_id)
    return expected_inputs(engine_io(engine), engine.build_options.get("profiles", {}))


def _problems(want: ExpectedInput, array: np.ndarray) -> list[str]:
    problems = []
    if str(array.dtype) != want.dtype:
        problems.append(f"input {want.name!r} is {array.dtype}, the engine takes {want.dtype}")
    shape = tuple(int(d) for d in array.shape)
    if len(shape) != len(want.dims):
        problems.append(
            f"input {want.name!r} has shape {list(shape)} ({len(shape)} dims), "
            f"the engine takes {len(want.dims)} dims: {want.shape_text}"
        )
        return problems
    outside = [
        f"dim {i} is {size}, outside {lo}..{'any' if hi is None else hi}"
        for i, (size, (lo, hi)) in enumerate(zip(shape, want.dims, strict=True))
        if size < lo or (hi is not None and size > hi)
    ]
    if outside:
        problems.append(
            f"input {want.name!r} has shape {list(shape)}: {'; '.join(outside)} (the engine takes {want.shape_text})"
        )
    return problems


def check_inputs(
    path: Path, io: Sequence[TensorIO], profiles: Mapping[str, Mapping[str, Sequence[int]]]
) -> InputsCheck:
    """The file's arrays for the engine's inputs (read by `load_inputs`, which names a missing one);
    raises TestInputError naming every dtype or shape that does not fit."""
    feeds: dict[str, Any] = load_inputs(path, io)
    try:
        with np.load(path) as data:
            names = list(data.files)
    except (OSError, ValueError) as err:  # load_inputs read it a moment ago; say so if it changed
        raise TestInputError(f"cannot read inputs from {path}: {err}") from err
    wanted = expected_inputs(io, profiles)
    problems = [p for want in wanted for p in _problems(want, np.asarray(feeds[want.name]))]
    if problems:
        raise TestInputError(f"{path.name} does not fit the engine: " + "; ".join(problems))
    checked = tuple(
        CheckedInput(w.name, str(feeds[w.name].dtype), tuple(int(d) for d in feeds[w.name].shape)) for w in wanted
    )
    return InputsCheck(checked, tuple(n for n in names if n not in feeds))


def check_engine_inputs(app: AppContext, engine_id: int, path: Path) -> InputsCheck:
    """`check_inputs` against engine `engine_id` as the catalog recorded it."""
    engine = get_engine(app, engine_id)
    return check_inputs(path, engine_io(engine), engine.build_options.get("profiles", {}))
