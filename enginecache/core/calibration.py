"""Calibration data for int8/fp8 Q/DQ recipes: a checked `.npz` file, or seeded random inputs.

An `.npz` file holds one array per model input, named exactly after it. The first axis of
every array is the sample axis and doubles as the model's batch axis: array `input` of shape
`[N, 3, 224, 224]` holds N images for a model input `input[batch, 3, 224, 224]`. When the
model's first dim is dynamic, each array is fed as one batch of N; when it is static (B), the
arrays are split into N / B batches of B.

Without a file, random inputs stand in (seeded, so the recipe is reproducible): float inputs
draw from a standard normal, integer inputs whose name contains "mask" are ones, other integer
inputs draw from [0, 100), bool inputs are True. Shapes come from `input_shapes` (pass the
optimization profile's opt shapes); a dynamic first dim becomes 1 and any other dynamic dim
becomes `DEFAULT_DYNAMIC_DIM` (16). Scales from random inputs are a placeholder, not a
calibration: `calibration_feeds`, which picks the file or the generated feeds for a recipe, returns
the warning that says so.
"""

from __future__ import annotations

import logging
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto

from enginecache.core.hashing import sha256_file
from enginecache.core.input_hints import read_input_hints
from enginecache.core.inputs import InputSlot, generate_feed
from enginecache.errors import CalibrationError, PrecisionError

logger = logging.getLogger(__name__)

DEFAULT_DYNAMIC_DIM = 16
"""Size given to a dynamic dim other than the first when no input shape is passed."""

RANDOM_BATCHES = 4
"""Number of random batches fed to the calibrator when no calibration file is given."""

RANDOM_SEED = 0

Batch = dict[str, np.ndarray]

_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
_INT_TYPES = frozenset(
    {
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


@dataclass(frozen=True)
class ModelInput:
    """One graph input: name, ONNX element type and shape (ints static, strings dynamic)."""

    name: str
    elem_type: int
    shape: tuple[int | str, ...]

    @property
    def type_name(self) -> str:
        return str(TensorProto.DataType.Name(self.elem_type)).lower()

    @property
    def kind(self) -> str:
        """numpy dtype kind the input accepts: "f" float, "i" integer, "b" bool, "" other."""
        if self.elem_type in _FLOAT_TYPES:
            return "f"
        if self.elem_type in _INT_TYPES:
            return "i"
        if self.elem_type == TensorProto.BOOL:
            return "b"
        return ""

    @property
    def dtype(self) -> np.dtype[np.generic]:
        if self.elem_type == TensorProto.BFLOAT16:
            raise CalibrationError(f"input '{self.name}' is bfloat16; calibration feeds need fp32")
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))


def read_model_inputs(path: Path) -> tuple[ModelInput, ...]:
    """The graph inputs of an ONNX file (weights are not loaded; initializers listed as inputs
    by IR < 4 models are left out)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, ValueError, DecodeError) as err:
        raise PrecisionError(f"cannot read model inputs of {path}: {err}") from err
    initializers = {init.name for init in model.graph.initializer}
    inputs: list[ModelInput] = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dims: list[int | str] = []
        for dim in tensor.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                dims.append(int(dim.dim_value))
            elif dim.HasField("dim_param") and dim.dim_param:
                dims.append(str(dim.dim_param))
            else:
                dims.append("?")
        inputs.append(ModelInput(value.name, int(tensor.elem_type), tuple(dims)))
    return tuple(inputs)


def load_calibration(path: Path, inputs: Sequence[ModelInput]) -> dict[str, np.ndarray]:
    """Read a calibration `.npz` and check it against the model inputs.

    Array names must match the input names exactly; each array's rank must equal the input's
    rank (its first axis being the sample axis), its static dims must match, its dtype kind must
    fit (float for float inputs, integer for integer inputs, bool for bool), and every array must
    hold the same number of samples. Arrays come back cast to the inputs' exact dtypes.
    Raises `CalibrationError` naming the offending arrays.
    """
    if not path.is_file():
        raise CalibrationError(f"calibration file {path} does not exist")
    try:
        with np.load(str(path), allow_pickle=False) as npz:
            raw = {name: np.asarray(npz[name]) for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile) as err:
        raise CalibrationError(f"calibration file {path} is not a readable .npz: {err}") from err

    expected = {inp.name for inp in inputs}
    missing = sorted(expected - raw.keys())
    extra = sorted(raw.keys() - expected)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing arrays for model inputs {missing}")
        if extra:
            parts.append(f"extra arrays {extra} that are not model inputs")
        raise CalibrationError(f"calibration file {path.name}: {'; '.join(parts)}; expected exactly {sorted(expected)}")

    arrays: dict[str, np.ndarray] = {}
    for inp in inputs:
        arrays[inp.name] = _check_array(path, inp, raw[inp.name])

    counts = {name: arr.shape[0] for name, arr in arrays.items() if arr.ndim > 0}
    if len(set(counts.values())) > 1:
        raise CalibrationError(f"calibration file {path.name}: arrays hold different sample counts on axis 0: {counts}")
    if any(n == 0 for n in counts.values()):
        raise CalibrationError(f"calibration file {path.name}: arrays hold no samples: {counts}")
    return arrays


def _check_array(path: Path, inp: ModelInput, arr: np.ndarray) -> np.ndarray:
    where = f"calibration file {path.name}: array '{inp.name}'"
    if arr.ndim != len(inp.shape):
        raise CalibrationError(
            f"{where} has rank {arr.ndim} (shape {list(arr.shape)}) but model input "
            f"'{inp.name}' has rank {len(inp.shape)} {list(inp.shape)}; axis 0 is the sample axis"
        )
    for axis, (want, got) in enumerate(zip(inp.shape, arr.shape, strict=True)):
        if axis > 0 and isinstance(want, int) and want != got:
            raise CalibrationError(
                f"{where} has shape {list(arr.shape)}; model input needs {list(inp.shape)} (axis {axis} must be {want})"
            )
    if inp.kind == "":
        raise CalibrationError(f"{where}: model input type {inp.type_name} cannot be calibrated")
    got_kind = "i" if arr.dtype.kind in "iu" else arr.dtype.kind
    if got_kind != inp.kind:
        raise CalibrationError(f"{where} has dtype {arr.dtype} but model input '{inp.name}' is {inp.type_name}")
    dtype = inp.dtype
    if got_kind == "i" and arr.size:
        info = np.iinfo(dtype.str)
        if int(arr.min()) < info.min or int(arr.max()) > info.max:
            raise CalibrationError(f"{where} has values outside the range of {inp.type_name}")
    return arr.astype(dtype, copy=False)


def batch_arrays(arrays: Mapping[str, np.ndarray], inputs: Sequence[ModelInput]) -> list[Batch]:
    """Split checked calibration arrays into feeds: one batch of all samples when the first dim
    is dynamic, else batches of the model's static batch size."""
    batch_sizes = {inp.shape[0] for inp in inputs if inp.shape and isinstance(inp.shape[0], int)}
    ranked = [arr for arr in arrays.values() if arr.ndim > 0]
    if not batch_sizes or not ranked:
        return [dict(arrays)]
    if len(batch_sizes) > 1:
        raise CalibrationError(f"model inputs disagree on a static batch size: {sorted(batch_sizes)}")
    size = batch_sizes.pop()
    samples = ranked[0].shape[0]
    if samples % size:
        raise CalibrationError(
            f"calibration arrays hold {samples} samples, not a multiple of the model's static batch size {size}"
        )
    batches: list[Batch] = []
    for start in range(0, samples, size):
        batches.append({name: (arr[start : start + size] if arr.ndim > 0 else arr) for name, arr in arrays.items()})
    return batches


def resolve_shapes(
    inputs: Sequence[ModelInput], input_shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, tuple[int, ...]]:
    """Concrete shapes for random feeds: `input_shapes` where given, else dynamic dims replaced
    (first dim by 1, others by `DEFAULT_DYNAMIC_DIM`)."""
    given = dict(input_shapes or {})
    names = {inp.name for inp in inputs}
    unknown = sorted(given.keys() - names)
    if unknown:
        raise PrecisionError(f"input_shapes names {unknown}, not model inputs {sorted(names)}")
    shapes: dict[str, tuple[int, ...]] = {}
    for inp in inputs:
        if inp.name in given:
            shape = tuple(int(d) for d in given[inp.name])
            if len(shape) != len(inp.shape) or any(
                isinstance(want, int) and want != got for want, got in zip(inp.shape, shape, strict=True)
            ):
                raise PrecisionError(
                    f"input_shapes['{inp.name}'] = {list(shape)} does not fit model input {list(inp.shape)}"
                )
            if any(d <= 0 for d in shape):
                raise PrecisionError(f"input_shapes['{inp.name}'] = {list(shape)} has a dim <= 0")
            shapes[inp.name] = shape
        else:
            shapes[inp.name] = tuple(
                dim if isinstance(dim, int) else (1 if axis == 0 else DEFAULT_DYNAMIC_DIM)
                for axis, dim in enumerate(inp.shape)
            )
    return shapes


def random_batches(
    inputs: Sequence[ModelInput],
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    *,
    batches: int = RANDOM_BATCHES,
    seed: int = RANDOM_SEED,
    model: Path | None = None,
) -> list[Batch]:
    """Seeded generated feeds standing in for calibration data: `core.inputs.generate_feed`, the
    generator test-load uses, following what `model` (the ONNX file being calibrated, read without
    its weights) says about each input (Gather bounds, Equal constants); see core.inputs."""
    shapes = resolve_shapes(inputs, input_shapes)
    rng = np.random.default_rng(seed)
    slots = [InputSlot(inp.name, np.dtype(inp.dtype), shapes[inp.name]) for inp in inputs]
    hints = read_input_hints(model, CalibrationError) if model is not None else None
    return [generate_feed(slots, rng, CalibrationError, hints) for _ in range(batches)]


@dataclass(frozen=True)
class CalibrationFeeds:
    """The feeds an int8/fp8 recipe calibrates on, with what its recipe records of them."""

    feeds: list[Batch]
    calibration: str  # "npz" | "random"
    digest: str | None  # the .npz file's sha256; None for generated feeds
    options: Mapping[str, object]  # the recipe's options they set: generated feeds' `random_shapes`
    notes: tuple[str, ...]  # generated feeds' "uncalibrated" warning

    def record(self) -> dict[str, object]:
        """The recipe's calibration fields."""
        return {
            "calibration": self.calibration,
            "calibration_digest": self.digest,
            "calibration_samples": count_samples(self.feeds),
        }


def calibration_feeds(
    source: Path, calibration: Path | None, precision: str, input_shapes: Mapping[str, Sequence[int]] | None
) -> CalibrationFeeds:
    """The batches of the `calibration` .npz (checked against `source`'s inputs), or without one
    seeded generated feeds at `input_shapes` and the warning that they calibrate nothing."""
    inputs = read_model_inputs(source)
    if calibration is not None:
        feeds = batch_arrays(load_calibration(calibration, inputs), inputs)
        return CalibrationFeeds(feeds, "npz", sha256_file(calibration), {}, ())
    feeds = random_batches(inputs, input_shapes, model=source)
    shapes = resolve_shapes(inputs, input_shapes)
    return CalibrationFeeds(
        feeds,
        "random",
        None,
        {"random_shapes": {name: list(shape) for name, shape in shapes.items()}},
        (f"uncalibrated: {precision} scales come from random inputs; pass --calib FILE.npz",),
    )


def count_samples(feeds: Sequence[Batch]) -> int:
    """Samples in a list of feeds: the sum of each feed's first-axis length."""
    total = 0
    for feed in feeds:
        ranked = [arr for arr in feed.values() if arr.ndim > 0]
        total += ranked[0].shape[0] if ranked else 1
    return total


def save_batches(feeds: Sequence[Batch], folder: Path) -> Path:
    """Write feeds as `folder/batch_0000.npz`, ... (one .npz per batch, the layout ModelOpt
    AutoCast's reference runner reads from a folder); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for index, feed in enumerate(feeds):
        arrays: dict[str, Any] = dict(feed)
        np.savez(folder / f"batch_{index:04d}.npz", **arrays)
    return folder


class BatchReader:
    """An `onnxruntime.quantization.CalibrationDataReader` over prepared feeds, with the
    `get_first` that ModelOpt's PTQ also calls (duck-typed, so that importing this module does not
    import onnxruntime)."""

    def __init__(self, feeds: Sequence[Batch]) -> None:
        self._feeds = list(feeds)
        self._next = 0

    def get_next(self) -> Batch | None:
        if self._next >= len(self._feeds):
            return None
        feed = self._feeds[self._next]
        self._next += 1
        return feed

    def get_first(self) -> Batch:
        """The first feed, without moving on (ModelOpt's PTQ runs it once to learn shapes)."""
        if not self._feeds:
            raise CalibrationError("no calibration feeds")
        return self._feeds[0]

    def rewind(self) -> None:
        self._next = 0

    def __len__(self) -> int:
        return len(self._feeds)
