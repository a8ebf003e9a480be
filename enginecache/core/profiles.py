"""Optimization profiles: min/opt/max shapes per dynamic input.

Defaults are derived from each input's dynamic dims and always reported, so a user can see
and override them (`--profile input=1x3x224x224,4x3x224x224,8x3x224x224`). Dims that share a
symbolic name across inputs (`batch`, `seq`) get the same values in every input.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from enginecache.core.onnx_info import TensorInfo
from enginecache.errors import ProfileError

Shape = tuple[int, ...]

# (min, opt, max) for a dynamic dim, by the role we infer for it.
BATCH_DIM_DEFAULT: tuple[int, int, int] = (1, 1, 8)
SEQUENCE_DIM_DEFAULT: tuple[int, int, int] = (1, 128, 512)
SPATIAL_DIM_DEFAULT: tuple[int, int, int] = (32, 224, 512)
OTHER_DIM_DEFAULT: tuple[int, int, int] = (1, 64, 256)


@dataclass(frozen=True)
class InputProfile:
    """The min/opt/max shapes of one input."""

    name: str
    min: Shape
    opt: Shape
    max: Shape

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}


@dataclass(frozen=True)
class ProfileResult:
    """The profile for every input of a model, with the source of each (default or user)."""

    inputs: tuple[InputProfile, ...]
    defaulted: tuple[str, ...]

    def to_dict(self) -> dict[str, dict[str, list[int]]]:
        return {p.name: p.to_dict() for p in self.inputs}

    def opt_shapes(self) -> dict[str, Shape]:
        return {p.name: p.opt for p in self.inputs}

    def describe_defaults(self) -> list[str]:
        lines = []
        for p in self.inputs:
            if p.name in self.defaulted:
                lines.append(f"default profile for {p.name}: min {_fmt(p.min)}, opt {_fmt(p.opt)}, max {_fmt(p.max)}")
        return lines


def _fmt(shape: Shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"


def parse_shape(text: str) -> Shape:
    """'1x3x224x224' -> (1, 3, 224, 224)."""
    parts = text.strip().lower().split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError as err:
        raise ProfileError(f"bad shape {text!r}: expected dims joined by 'x', like 1x3x224x224") from err
    if any(d <= 0 for d in dims):
        raise ProfileError(f"bad shape {text!r}: every dim must be a positive integer")
    return dims


def parse_profile_args(args: Iterable[str]) -> dict[str, tuple[Shape, Shape, Shape]]:
    """Parse `INPUT=MIN,OPT,MAX` (or `INPUT=SHAPE` for one fixed shape) arguments."""
    result: dict[str, tuple[Shape, Shape, Shape]] = {}
    for arg in args:
        name, sep, shapes = arg.partition("=")
        if not sep or not name.strip():
            raise ProfileError(
                f"bad profile {arg!r}: expected INPUT=MIN,OPT,MAX like input=1x3x224x224,4x3x224x224,8x3x224x224"
            )
        parts = [parse_shape(s) for s in shapes.split(",")]
        if len(parts) == 1:
            parts = parts * 3
        if len(parts) != 3:
            raise ProfileError(f"bad profile {arg!r}: give one shape or three (MIN,OPT,MAX)")
        result[name.strip()] = (parts[0], parts[1], parts[2])
    return result


def _dim_role(tensor: TensorInfo, axis: int, dim_name: str) -> tuple[int, int, int]:
    lowered = dim_name.lower()
    if axis == 0 or "batch" in lowered:
        return BATCH_DIM_DEFAULT
    if any(key in lowered for key in ("seq", "len", "token", "position", "past", "total")):
        return SEQUENCE_DIM_DEFAULT
    if (len(tensor.shape) == 4 and axis in (2, 3)) or lowered in ("height", "width", "h", "w"):
        return SPATIAL_DIM_DEFAULT
    if tensor.dtype.startswith("int") and len(tensor.shape) == 2 and axis == 1:
        return SEQUENCE_DIM_DEFAULT
    return OTHER_DIM_DEFAULT


def default_profile(tensor: TensorInfo, shared: dict[str, tuple[int, int, int]]) -> InputProfile:
    """The default min/opt/max shapes for one input (shared: symbolic dim name -> values)."""
    mins: list[int] = []
    opts: list[int] = []
    maxs: list[int] = []
    for axis, dim in enumerate(tensor.shape):
        if isinstance(dim, int):
            values = (dim, dim, dim)
        else:
            key = dim if dim != "?" else f"{tensor.name}:{axis}"
            values = shared.setdefault(key, _dim_role(tensor, axis, dim))
        mins.append(values[0])
        opts.append(values[1])
        maxs.append(values[2])
    return InputProfile(tensor.name, tuple(mins), tuple(opts), tuple(maxs))


def _check_override(tensor: TensorInfo, shapes: tuple[Shape, Shape, Shape]) -> InputProfile:
    low, opt, high = shapes
    for label, shape in (("min", low), ("opt", opt), ("max", high)):
        if len(shape) != len(tensor.shape):
            raise ProfileError(
                f"profile for {tensor.name!r}: {label} shape {_fmt(shape)} has rank {len(shape)}, "
                f"the model's input has rank {len(tensor.shape)} {_describe(tensor)}"
            )
        for axis, (given, declared) in enumerate(zip(shape, tensor.shape, strict=True)):
            if isinstance(declared, int) and given != declared:
                raise ProfileError(
                    f"profile for {tensor.name!r}: {label} dim {axis} is {given} but the model fixes it "
                    f"to {declared} {_describe(tensor)}"
                )
    for axis in range(len(low)):
        if not low[axis] <= opt[axis] <= high[axis]:
            raise ProfileError(
                f"profile for {tensor.name!r}: dim {axis} must satisfy min <= opt <= max, got "
                f"{low[axis]}, {opt[axis]}, {high[axis]}"
            )
    return InputProfile(tensor.name, low, opt, high)


def _describe(tensor: TensorInfo) -> str:
    return "[" + ", ".join(str(d) for d in tensor.shape) + "]"


def resolve_profile(
    inputs: Sequence[TensorInfo], overrides: Mapping[str, tuple[Shape, Shape, Shape]] | None = None
) -> ProfileResult:
    """Profiles for all inputs: user overrides where given, defaults from dynamic dims elsewhere."""
    overrides = dict(overrides or {})
    by_name = {t.name: t for t in inputs}
    unknown = sorted(set(overrides) - set(by_name))
    if unknown:
        raise ProfileError(
            f"profile names input(s) {', '.join(unknown)} that the model does not have; "
            f"its inputs are: {', '.join(by_name) or '(none)'}"
        )
    shared: dict[str, tuple[int, int, int]] = {}
    # Seed shared symbolic dims from overrides so defaulted inputs agree with them.
    for name, shapes in overrides.items():
        tensor = by_name[name]
        checked = _check_override(tensor, shapes)
        for axis, dim in enumerate(tensor.shape):
            if isinstance(dim, str) and dim != "?":
                shared.setdefault(dim, (checked.min[axis], checked.opt[axis], checked.max[axis]))
    profiles: list[InputProfile] = []
    defaulted: list[str] = []
    for tensor in inputs:
        if tensor.name in overrides:
            profiles.append(_check_override(tensor, overrides[tensor.name]))
        else:
            profiles.append(default_profile(tensor, shared))
            if tensor.is_dynamic:
                defaulted.append(tensor.name)
    return ProfileResult(tuple(profiles), tuple(defaulted))
