"""Accuracy of an engine's outputs against the fp32 source model's, per output, per precision.

The reference is the source ONNX run by ONNX Runtime on the CPU with every graph optimization
disabled (`ORT_DISABLE_ALL`): an ORT engine is an optimized model, so its reference must take
another path, or a broken optimization would agree with itself. An already-quantized source is the
exception (`REFERENCE_PATH_QUANTIZED`): with its optimizations disabled ONNX Runtime runs each
DequantizeLinear -> float op -> QuantizeLinear in float, which rounds differently from the integer
kernels its optimizer fuses them into (the model's real arithmetic, and what an ORT engine runs), so
its reference runs at `ORT_ENABLE_ALL`, the level an ORT engine is built at.

Each output is judged in *parts*. Most outputs are one part. An output whose channel axis (the last
axis; for rank >= 3 also axis 1, channel-first layouts such as YOLO's [1, 84, 8400]) ends in a block
of class scores is two parts, values and scores, each judged on its own, so probabilities are not
drowned by box coordinates ~230 (the rule is `split_parts`). A part passes when:

1. every element passes Polygraphy's check `|out - ref| <= atol * scale + rtol * |ref|` (or is
   equal, inf included) where `scale = max(1, max |ref|)` over the element's *slice*: the slice of
   its channel along the last axis (and along axis 1 for rank >= 3, the smaller scale winning),
   where such a slice holds at least MIN_SLICE_ELEMENTS elements, else over the whole part. So
   int8's error, a share of a tensor's range, is judged against the range of the channel the
   element is in, and a small-range channel is judged against its own range;
2. its cosine similarity with the reference is >= min_cosine;
3. for a class-score part (role "scores" or "logits"), top-1 and top-5 agreement are >= min_top1
   and min_top5. A row agrees on top-1 when the engine's best class is one the reference scores
   as best up to the element tolerance of rule 1 (ties count as agreement); top-5 is the mean share
   of the engine's five best classes that the reference puts among its five best, up to the same
   tolerance.

Max abs error, max rel error (|out - ref| / max(|ref|, 1e-6)) and the share of failing elements are
reported per output, cosine, top-1 and top-5 per part. The thresholds (atol, rtol, min_cosine,
min_top1, min_top5) are a precision's `Tolerances` (`core.tolerances`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from enginecache.core.backends.base import Feeds
from enginecache.core.backends.registry import declarations
from enginecache.core.lazyimport import import_backend
from enginecache.core.tolerances import Tolerances
from enginecache.core.tolerances import tolerances_for as tolerances_for  # re-exported
from enginecache.errors import TestInputError

MIN_SLICE_ELEMENTS = 16
"""A channel slice with fewer elements does not set its own scale (the whole part's range does)."""

MIN_SPLIT_ROWS = 8
"""An output is split into values and scores only when it has at least this many rows."""

SPLIT_RANGE = 10.0
"""... and its leading (values) block reaches at least this magnitude (scores are <= 1)."""

SUM_TOLERANCE = 1e-2
"""Rows of [0, 1] values summing to 1 within this are probabilities (softmax)."""

_SCORE_NAME = re.compile(r"logit|score|prob|cls|class|conf", re.IGNORECASE)

REFERENCE_PATH = "ONNX Runtime CPU, graph optimizations disabled (ORT_DISABLE_ALL)"
REFERENCE_PATH_QUANTIZED = (
    "ONNX Runtime CPU, graph optimizations on (ORT_ENABLE_ALL, as an ORT engine is built): the source is "
    "quantized, and its integer kernels are its arithmetic"
)


def is_library_error(err: BaseException) -> bool:
    """An error raised by a backend library (RuntimeError/ValueError, or a class of the library or of
    a module its backend declares as its own: ONNX Runtime's derive from Exception only), which
    means "the backend refused this", not a bug of ours."""
    if isinstance(err, RuntimeError | ValueError):
        return True
    root = type(err).__module__.split(".")[0]
    return any(root == d.library or root in d.error_modules for d in declarations())


# -- parts of an output --------------------------------------------------------------------


@dataclass(frozen=True)
class Part:
    """A block of channels [start, stop) along `axis` (None: the whole output) and its role."""

    role: str  # "values" | "scores" (probabilities) | "logits" (named like class scores)
    axis: int | None = None
    start: int = 0
    stop: int = 0

    def label(self, name: str, ndim: int) -> str:
        if self.axis is None:
            return name
        if self.axis == ndim - 1:
            return f"{name}[..., {self.start}:{self.stop}]"
        return f"{name}[{':, ' * self.axis}{self.start}:{self.stop}, ...]"

    def take(self, array: np.ndarray) -> np.ndarray:
        if self.axis is None:
            return array
        index: list[slice] = [slice(None)] * array.ndim
        index[self.axis] = slice(self.start, self.stop)
        return array[tuple(index)]


def split_parts(name: str, ref: np.ndarray) -> list[Part]:
    """The parts an output is judged in (for float outputs of rank >= 2; else one "values" part).

    Along the last axis, then (rank >= 3) axis 1, with the reference's values seen as rows x C:
    - all C >= 2 channels in [0, 1] and every row summing to 1 (softmax), or the output named like
      class scores (logit, score, prob, cls, class, conf): one "scores" part;
    - a trailing run of k >= 2 channels in [0, 1] after channels reaching >= SPLIT_RANGE in
      magnitude, with >= MIN_SPLIT_ROWS rows (a detector's boxes then class scores): a "values"
      part and a "scores" part;
    - along the last axis only, an output named like class scores: one "logits" part.
    """
    whole = [Part("values")]
    if ref.ndim < 2 or ref.dtype.kind != "f" or ref.size == 0:
        return whole
    named = bool(_SCORE_NAME.search(name))
    for axis in [ref.ndim - 1] + ([1] if ref.ndim >= 3 else []):
        channels = ref.shape[axis]
        if channels < 2:
            continue
        rows = np.moveaxis(ref, axis, -1).reshape(-1, channels).astype(np.float64)
        finite = np.isfinite(rows).all(axis=0)
        in_unit = finite & (rows >= 0).all(axis=0) & (rows <= 1).all(axis=0)
        if in_unit.all():
            if named or bool(np.all(np.abs(rows.sum(axis=1) - 1.0) <= SUM_TOLERANCE)):
                return [Part("scores", axis, 0, channels)]
            continue
        trailing = channels - int(np.flatnonzero(~in_unit)[-1]) - 1
        leading = rows[:, : channels - trailing]
        if (
            trailing >= 2
            and rows.shape[0] >= MIN_SPLIT_ROWS
            and float(np.max(np.abs(np.where(np.isfinite(leading), leading, 0.0)))) >= SPLIT_RANGE
        ):
            return [Part("values", axis, 0, channels - trailing), Part("scores", axis, channels - trailing, channels)]
        if named and axis == ref.ndim - 1:
            return [Part("logits", axis, 0, channels)]
    return whole


def slice_scale(ref: np.ndarray) -> np.ndarray:
    """Per element, max(1, max |ref|) over its channel slice (rule 1 of the module docstring)."""
    magnitude = np.where(np.isfinite(ref), np.abs(ref), 0.0)
    if magnitude.size == 0:
        return np.ones_like(magnitude)
    axes = sorted({ref.ndim - 1, 1}) if ref.ndim >= 3 else list(range(ref.ndim)[-1:])
    scale: np.ndarray | None = None
    for axis in axes:
        if magnitude.size // ref.shape[axis] < MIN_SLICE_ELEMENTS:
            continue
        others = tuple(a for a in range(ref.ndim) if a != axis)
        per_channel = magnitude.max(axis=others, keepdims=True)
        scale = per_channel if scale is None else np.minimum(scale, per_channel)
    if scale is None:
        scale = np.asarray(magnitude.max())
    floored: np.ndarray = np.maximum(1.0, np.broadcast_to(scale, ref.shape))
    return floored


def _finite_max(values: np.ndarray) -> float:
    """The largest finite value (0 for none): NaN and inf are counted as failing elements instead."""
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 0.0


def _cosine(a: np.ndarray, r: np.ndarray) -> float:
    a, r = a.ravel(), r.ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(r))
    if norms == 0.0 or not np.isfinite(norms):
        return 1.0 if np.array_equal(a, r) else 0.0
    return float(np.dot(a, r) / norms)


def _agreement(got: np.ndarray, ref: np.ndarray, allowed: np.ndarray, axis: int) -> tuple[float, float | None]:
    """Top-1 and top-5 agreement along `axis` (module docstring, rule 3); top-5 None for <= 5 classes."""
    classes = ref.shape[axis]
    g = np.moveaxis(got, axis, -1).reshape(-1, classes)
    r = np.moveaxis(ref, axis, -1).reshape(-1, classes)
    tol = np.moveaxis(allowed, axis, -1).reshape(-1, classes)
    rows = np.arange(r.shape[0])
    best = r.argmax(axis=1)
    tie = tol[rows, best]
    top1 = float(np.mean(r[rows, g.argmax(axis=1)] >= r[rows, best] - tie))
    if classes <= 5:
        return top1, None
    fifth = np.partition(r, classes - 5, axis=1)[:, classes - 5]
    chosen = np.argpartition(g, classes - 5, axis=1)[:, classes - 5 :]
    top5 = float(np.mean(r[rows[:, None], chosen] >= (fifth - tie)[:, None]))
    return top1, top5


@dataclass(frozen=True)
class PartAccuracy:
    label: str
    role: str
    cosine: float
    max_abs: float
    failing_elements: int
    elements: int
    scale_min: float
    scale_max: float
    top1: float | None = None
    top5: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class OutputAccuracy:
    name: str
    max_abs: float
    max_rel: float
    cosine: float  # the lowest cosine of its parts
    passed: bool
    shape: tuple[int, ...]
    scale: float = 1.0  # the largest scale atol was multiplied by
    failing_elements: int = 0
    failing_fraction: float = 0.0
    scale_min: float = 1.0
    top1: float | None = None  # of its class-score part, where it has one
    top5: float | None = None
    parts: tuple[PartAccuracy, ...] = ()
    failed_checks: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "cosine": self.cosine,
            "passed": self.passed,
            "shape": list(self.shape),
            "scale": self.scale,
            "scale_min": self.scale_min,
            "failing_elements": self.failing_elements,
            "failing_fraction": self.failing_fraction,
            "top1": self.top1,
            "top5": self.top5,
            "parts": [p.to_dict() for p in self.parts],
            "failed_checks": list(self.failed_checks),
        }


def compare_output(name: str, got: np.ndarray, ref: np.ndarray, tolerances: Tolerances) -> OutputAccuracy:
    """One output against its reference (the module docstring's rules)."""
    t = tolerances.for_output(name)
    a = np.asarray(got).astype(np.float64)
    r = np.asarray(ref).astype(np.float64)
    diff = np.abs(a - r)
    size = int(diff.size)
    finite = np.isfinite(diff)
    max_abs = _finite_max(diff)
    max_rel = _finite_max(np.where(finite, diff, 0.0) / np.maximum(np.abs(np.nan_to_num(r)), 1e-6))
    parts: list[PartAccuracy] = []
    checks: list[str] = []
    failing = 0
    for part in split_parts(name, np.asarray(ref)):
        pa, pr, pd = part.take(a), part.take(r), part.take(diff)
        scale = slice_scale(pr)
        allowed = t.atol * scale + t.rtol * np.abs(pr)
        bad = ~((pd <= allowed) | (pa == pr))  # NaN compares False: it fails
        count = int(np.count_nonzero(bad))
        failing += count
        label = part.label(name, r.ndim)
        top1 = top5 = None
        if part.role in ("scores", "logits") and part.axis is not None and pr.size:
            top1, top5 = _agreement(pa, pr, allowed, part.axis)
        result = PartAccuracy(
            label,
            part.role,
            _cosine(pa, pr),
            _finite_max(pd),
            count,
            int(pr.size),
            float(scale.min()) if scale.size else 1.0,
            float(scale.max()) if scale.size else 1.0,
            top1,
            top5,
        )
        parts.append(result)
        if count:
            excess = np.where(bad, np.nan_to_num(pd - allowed, nan=np.inf), -np.inf)
            worst = np.unravel_index(int(np.argmax(excess)), pd.shape)
            at = [int(i) + (part.start if axis == part.axis else 0) for axis, i in enumerate(worst)]
            checks.append(
                f"{label}: {count} of {pr.size} elements ({count / pr.size:.2%}) outside "
                f"|out-ref| <= atol*scale + rtol*|ref| (worst at {at}: "
                f"out {pa[worst]:.6g}, ref {pr[worst]:.6g}, allowed {allowed[worst]:.3g})"
            )
        if result.cosine < t.min_cosine:
            checks.append(f"{label}: cosine {result.cosine:.6f} < {t.min_cosine}")
        if top1 is not None and top1 < t.min_top1:
            checks.append(f"{label}: top-1 agreement {top1:.4f} < {t.min_top1}")
        if top5 is not None and top5 < t.min_top5:
            checks.append(f"{label}: top-5 agreement {top5:.4f} < {t.min_top5}")
    scored = [p for p in parts if p.top1 is not None]
    return OutputAccuracy(
        name,
        max_abs,
        max_rel,
        min(p.cosine for p in parts),
        not checks,
        tuple(int(d) for d in np.shape(got)),
        scale=max(p.scale_max for p in parts),
        failing_elements=failing,
        failing_fraction=failing / size if size else 0.0,
        scale_min=min(p.scale_min for p in parts),
        top1=scored[0].top1 if scored else None,
        top5=scored[0].top5 if scored else None,
        parts=tuple(parts),
        failed_checks=tuple(checks),
    )


def compare_outputs(
    actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], tolerances: Tolerances
) -> list[OutputAccuracy]:
    """Every reference output against the engine's (`compare_output`); a missing output or one of
    another shape raises TestInputError."""
    results = []
    for name, ref in reference.items():
        if name not in actual:
            raise TestInputError(f"the engine produced no output {name!r} (it has {', '.join(actual)})")
        got = np.asarray(actual[name])
        if got.shape != np.shape(ref):
            raise TestInputError(f"output {name}: engine shape {got.shape} differs from the reference {np.shape(ref)}")
        results.append(compare_output(name, got, np.asarray(ref), tolerances))
    return results


def reference_session_options(ort: Any, *, quantized: bool = False) -> Any:
    """The reference run's session options: CPU, quiet, every graph optimization disabled (all of
    them on for a `quantized` source: the module docstring says why)."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    levels = ort.GraphOptimizationLevel
    options.graph_optimization_level = levels.ORT_ENABLE_ALL if quantized else levels.ORT_DISABLE_ALL
    return options


def reference_outputs(onnx_path: Path, feeds: Feeds, *, quantized: bool = False) -> dict[str, np.ndarray]:
    """The source model's outputs (REFERENCE_PATH: unoptimized, so an ORT engine is not its own
    reference; REFERENCE_PATH_QUANTIZED for a `quantized` source); a model ONNX Runtime cannot run on
    these feeds raises TestInputError with its words."""
    ort = import_backend("onnxruntime")
    try:
        session = ort.InferenceSession(
            str(onnx_path), reference_session_options(ort, quantized=quantized), providers=["CPUExecutionProvider"]
        )
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, dict(feeds))
    except Exception as err:
        if not is_library_error(err):
            raise
        raise TestInputError(f"ONNX Runtime could not run the reference {onnx_path.name}: {err}") from err
    return {name: np.asarray(v) for name, v in zip(names, values, strict=True)}
