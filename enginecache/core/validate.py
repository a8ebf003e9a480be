"""The test-load harness and the accuracy comparison (what Polygraphy's `run --trt --onnxrt` does).

`validate_engine()` runs every step of loading an engine, each timed: read the blob while verifying
its digest (one pass into one pre-sized buffer), the backend's validity check, deserialize,
execution context, I/O allocation, first inference, then N timed iterations. It then runs the
same inputs through ONNX Runtime on the source fp32 ONNX and compares every output against
tolerances that depend on the engine's precision. The verdict is one of:

- PASS / FAIL: loaded and ran; accuracy within / outside tolerances.
- INCOMPATIBLE: the backend's validity check refused the engine on this host (its diagnostic kept).
- CORRUPT: the blob's bytes do not match the recorded digest.
- ERROR: the engine passed the validity check but failed to load or run (the backend's message kept).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from enginecache.core.backends.base import Backend, EngineSession, Feeds, LoadSpec, PhaseTimer, TensorIO
from enginecache.core.hashing import read_verified
from enginecache.core.inputs import input_shapes, load_inputs, random_inputs
from enginecache.core.lazyimport import import_backend
from enginecache.errors import (
    BackendUnavailableError,
    EngineCacheError,
    IncompatibleEngineError,
    IntegrityCheckError,
    LoadFailedError,
    TestInputError,
)

logger = logging.getLogger(__name__)

PASS = "PASS"
FAIL = "FAIL"
INCOMPATIBLE = "INCOMPATIBLE"
CORRUPT = "CORRUPT"
ERROR = "ERROR"
VERDICTS = (PASS, FAIL, INCOMPATIBLE, CORRUPT, ERROR)

# The load phases in the order they run (the dashboard draws them as one stacked bar).
LOAD_PHASES = ("read_verify", "validity", "deserialize", "create_context", "allocate_io", "first_inference")


@dataclass(frozen=True)
class Tolerances:
    """Polygraphy-style element-wise check, with the absolute part scaled by the output's range.

    An element passes when |engine - reference| <= atol * scale + rtol * |reference|, where
    scale = max(1, max |reference|) (so int8's error, which is a share of the tensor's range,
    is judged as such); an output passes when every element does, all are finite, and the
    cosine similarity with the reference is >= min_cosine.
    """

    atol: float
    rtol: float
    min_cosine: float

    def to_dict(self) -> dict[str, float]:
        return {"atol": self.atol, "rtol": self.rtol, "min_cosine": self.min_cosine}


# Defaults per precision (docs/runtime.md explains them); override with `tolerances=`.
DEFAULT_TOLERANCES: dict[str, Tolerances] = {
    "fp32": Tolerances(atol=1e-4, rtol=1e-3, min_cosine=0.99999),
    "fp16": Tolerances(atol=1e-2, rtol=1e-2, min_cosine=0.999),
    "bf16": Tolerances(atol=5e-2, rtol=5e-2, min_cosine=0.995),
    "int8": Tolerances(atol=0.25, rtol=0.1, min_cosine=0.98),
    "fp8": Tolerances(atol=0.3, rtol=0.15, min_cosine=0.97),
}


def tolerances_for(precision: str, overrides: Mapping[str, float] | None = None) -> Tolerances:
    base = DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["fp32"])
    if not overrides:
        return base
    unknown = set(overrides) - {"atol", "rtol", "min_cosine"}
    if unknown:
        raise TestInputError(f"unknown tolerance(s) {', '.join(sorted(unknown))}: use atol, rtol, min_cosine")
    return replace(base, **{k: float(v) for k, v in overrides.items()})


@dataclass(frozen=True)
class OutputAccuracy:
    name: str
    max_abs: float
    max_rel: float
    cosine: float
    passed: bool
    shape: tuple[int, ...]
    scale: float = 1.0  # max(1, max |reference|): what atol is multiplied by
    failing_elements: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "cosine": self.cosine,
            "passed": self.passed,
            "shape": list(self.shape),
            "scale": self.scale,
            "failing_elements": self.failing_elements,
        }


def compare_outputs(
    actual: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], tolerances: Tolerances
) -> list[OutputAccuracy]:
    """Per output: max abs error, max rel error (|a-r| / max(|r|, eps)), cosine similarity, and the
    element-wise verdict described on `Tolerances`."""
    results = []
    for name, ref in reference.items():
        if name not in actual:
            raise TestInputError(f"the engine produced no output {name!r} (it has {', '.join(actual)})")
        got = np.asarray(actual[name])
        if got.shape != ref.shape:
            raise TestInputError(f"output {name}: engine shape {got.shape} differs from the reference {ref.shape}")
        a = got.astype(np.float64).ravel()
        r = np.asarray(ref).astype(np.float64).ravel()
        diff = np.abs(a - r)
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(r), 1e-6)).max()) if diff.size else 0.0
        norms = float(np.linalg.norm(a) * np.linalg.norm(r))
        cosine = (1.0 if max_abs == 0.0 else 0.0) if norms == 0.0 else float(np.dot(a, r) / norms)
        scale = max(1.0, float(np.abs(r).max())) if r.size else 1.0
        # NaN/inf compare False, so non-finite elements count as failing.
        failing = int(np.count_nonzero(~(diff <= tolerances.atol * scale + tolerances.rtol * np.abs(r))))
        passed = failing == 0 and cosine >= tolerances.min_cosine
        results.append(
            OutputAccuracy(
                name, max_abs, max_rel, cosine, passed, tuple(got.shape), scale=scale, failing_elements=failing
            )
        )
    return results


def reference_outputs(onnx_path: Path, feeds: Feeds) -> dict[str, np.ndarray]:
    """The fp32 source model's outputs from ONNX Runtime on the CPU (the accuracy reference)."""
    ort = import_backend("onnxruntime")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, dict(feeds))
    except (RuntimeError, ValueError) as err:
        raise TestInputError(f"ONNX Runtime could not run the reference {onnx_path.name}: {err}") from err
    return {name: np.asarray(v) for name, v in zip(names, values, strict=True)}


# -- the harness ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LatencyStats:
    iterations: int
    batch: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    min_ms: float
    max_ms: float
    throughput: float  # samples per second (batch x iterations / time)

    def to_dict(self) -> dict[str, float | int]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def latency_stats(samples_s: Sequence[float], batch: int) -> LatencyStats:
    ms = np.asarray(samples_s, dtype=np.float64) * 1000.0
    total = float(np.sum(samples_s))
    return LatencyStats(
        iterations=len(samples_s),
        batch=batch,
        p50_ms=float(np.percentile(ms, 50)),
        p90_ms=float(np.percentile(ms, 90)),
        p99_ms=float(np.percentile(ms, 99)),
        mean_ms=float(ms.mean()),
        min_ms=float(ms.min()),
        max_ms=float(ms.max()),
        throughput=batch * len(samples_s) / total if total > 0 else math.inf,
    )


@dataclass(frozen=True)
class TestLoadSpec:
    """One engine to test-load: its blob, digests, source model, profile and precision."""

    __test__ = False  # not a pytest class

    engine_path: Path
    sha256: str
    source_onnx: Path  # the fp32 source model (the accuracy reference)
    io: tuple[TensorIO, ...]
    profiles: Mapping[str, Mapping[str, Sequence[int]]]
    precision: str
    backend_version: str | None = None
    targets: tuple[str, ...] = ()
    blake3: str | None = None  # the fast verify path when recorded
    iterations: int = 50
    batch: int | None = None
    inputs_path: Path | None = None
    tolerances: Tolerances | None = None
    seed: int = 0
    label: str = "engine"


@dataclass
class TestLoadResult:
    """Everything one test-load measured; `verdict` is one of VERDICTS."""

    __test__ = False

    verdict: str
    reason: str
    phases: dict[str, float] = field(default_factory=dict)
    latency: LatencyStats | None = None
    samples_ms: list[float] = field(default_factory=list)
    accuracy: list[OutputAccuracy] = field(default_factory=list)
    tolerances: Tolerances | None = None
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def load_seconds(self) -> float:
        """Read + validity + deserialize + context + I/O: what a service start pays."""
        return sum(v for k, v in self.phases.items() if k != "first_inference" and k in LOAD_PHASES)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "reason": self.reason,
            "phases": dict(self.phases),
            "load_seconds": self.load_seconds,
            "latency": self.latency.to_dict() if self.latency else None,
            "accuracy": [a.to_dict() for a in self.accuracy],
            "tolerances": self.tolerances.to_dict() if self.tolerances else None,
            "input_shapes": self.input_shapes,
            "details": self.details,
        }


def read_engine(path: Path, *, sha256: str, blake3: str | None, timer: PhaseTimer) -> bytearray:
    """Read a blob into one buffer while verifying it (BLAKE3 when recorded, else sha256): phase `read_verify`."""
    with timer.phase("read_verify"):
        if not path.is_file():
            raise IntegrityCheckError(f"blob {path} is missing")
        if blake3:
            return read_verified(path, blake3_digest=blake3)
        return read_verified(path, sha256=sha256)


def validate_engine(backend: Backend, spec: TestLoadSpec) -> TestLoadResult:
    """Run the whole test-load; every outcome is a result with a verdict, not an exception.

    Bad input (an inputs file that does not fit, a batch outside the profile) raises TestInputError.
    """
    timer = PhaseTimer()
    tolerances = spec.tolerances or tolerances_for(spec.precision)
    shapes = input_shapes(spec.profiles, spec.io, spec.batch)
    if spec.inputs_path is not None:
        feeds = load_inputs(spec.inputs_path, spec.io)
        shapes = {name: tuple(int(d) for d in np.shape(value)) for name, value in feeds.items()}
    else:
        feeds = random_inputs(spec.io, shapes, seed=spec.seed)
    result = TestLoadResult(
        verdict=ERROR,
        reason="",
        tolerances=tolerances,
        input_shapes={k: list(v) for k, v in shapes.items()},
    )
    result.phases = timer.phases  # filled as phases complete, also when a later one fails
    try:
        buffer = read_engine(spec.engine_path, sha256=spec.sha256, blake3=spec.blake3, timer=timer)
    except IntegrityCheckError as err:
        result.verdict, result.reason = CORRUPT, str(err)
        return result
    load_spec = LoadSpec(
        input_shapes=shapes, label=spec.label, backend_version=spec.backend_version, targets=spec.targets
    )
    session: EngineSession | None = None
    try:
        session = backend.load(buffer, load_spec, timer)
        del buffer
        with timer.phase("first_inference"):
            outputs = session.infer(feeds)
        samples: list[float] = []
        for _ in range(max(0, spec.iterations)):
            started = time.perf_counter()
            session.infer(feeds)
            samples.append(time.perf_counter() - started)
    except IncompatibleEngineError as err:
        result.verdict, result.reason, result.details = INCOMPATIBLE, str(err), dict(err.details)
        return result
    except BackendUnavailableError as err:
        result.verdict, result.reason = INCOMPATIBLE, str(err)
        result.details = {"error_type": type(err).__name__}
        return result
    except EngineCacheError as err:  # LoadFailedError, InferenceError, CudaError, BackendUnavailableError
        result.verdict, result.reason = ERROR, str(err)
        result.details = {"error_type": type(err).__name__}
        return result
    finally:
        if session is not None:
            session.close()
    first_shape: tuple[int, ...] = next(iter(shapes.values()), ())
    batch = int(first_shape[0]) if first_shape else 1
    if samples:
        result.latency = latency_stats(samples, batch)
        result.samples_ms = [s * 1000.0 for s in samples]
    reference = reference_outputs(spec.source_onnx, feeds)
    result.accuracy = compare_outputs(outputs, reference, tolerances)
    failed = [a.name for a in result.accuracy if not a.passed]
    if failed:
        worst = min(result.accuracy, key=lambda a: a.cosine)
        result.verdict = FAIL
        result.reason = (
            f"output(s) {', '.join(failed)} outside {spec.precision} tolerances {tolerances.to_dict()} "
            f"(worst cosine {worst.cosine:.6f}, max abs {max(a.max_abs for a in result.accuracy):.4g})"
        )
    else:
        result.verdict = PASS
        result.reason = (
            f"{len(result.accuracy)} output(s) within {spec.precision} tolerances "
            f"(min cosine {min((a.cosine for a in result.accuracy), default=1.0):.6f})"
        )
    return result


__all__ = [
    "CORRUPT",
    "DEFAULT_TOLERANCES",
    "ERROR",
    "FAIL",
    "INCOMPATIBLE",
    "LOAD_PHASES",
    "PASS",
    "LoadFailedError",
    "OutputAccuracy",
    "TestInputError",
    "TestLoadResult",
    "TestLoadSpec",
    "Tolerances",
    "compare_outputs",
    "validate_engine",
]
