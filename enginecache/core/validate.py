"""The test-load harness (what Polygraphy's `run --trt --onnxrt` does); the comparison is core.accuracy.

`validate_engine()` makes the inputs first (an .npz, or `core.inputs`' generator following the
source model's graph; an input too large to allocate is refused there), then runs every step of
loading an engine, each timed: read the blob while verifying its digest (one pass into one
pre-sized buffer), the backend's validity check, deserialize, execution context, I/O allocation,
first inference, then N timed iterations. It then runs the same inputs through the source fp32
ONNX (ONNX Runtime, graph optimizations off) and compares every output against tolerances that
depend on the engine's precision. An fp32 ("as is") engine of an already-quantized source runs the
source's quantized arithmetic: it is judged at that arithmetic's tolerances (int8's, or fp8's) against
the reference core.accuracy names for a quantized source (its graph optimizations on), and the
verdict's reason says so. The verdict is one of:

- PASS / FAIL: loaded and ran; accuracy within / outside tolerances.
- INCOMPATIBLE: the backend's validity check refused the engine on this host (its diagnostic kept).
- CORRUPT: the blob's bytes do not match the recorded digest.
- ERROR: the engine passed the validity check but failed to load or run, or the reference could
  not run on the inputs, or the outputs do not match the reference's names and shapes (the
  library's message kept).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from enginecache.core.accuracy import (
    REFERENCE_PATH,
    REFERENCE_PATH_QUANTIZED,
    OutputAccuracy,
    compare_outputs,
    is_library_error,
    reference_outputs,
)
from enginecache.core.backends.base import Backend, EngineSession, LoadSpec, PhaseTimer, TensorIO
from enginecache.core.input_hints import read_input_hints
from enginecache.core.inputs import (
    engine_slots,
    feed_rules,
    generate_feed,
    input_shapes,
    load_inputs,
    random_inputs,
)
from enginecache.core.tolerances import DEFAULT_TOLERANCES, Tolerances, tolerances_for
from enginecache.core.verdicts import LOAD_OUTCOMES, Verdict
from enginecache.core.verifiedread import read_verified
from enginecache.errors import (
    BackendUnavailableError,
    EngineCacheError,
    IncompatibleEngineError,
    IntegrityCheckError,
    LoadFailedError,
    TestInputError,
)

logger = logging.getLogger(__name__)

# A run's verdict as the catalog's load runs write it (`core.verdicts`: the one vocabulary).
PASS = Verdict.PASS.outcome
FAIL = Verdict.FAIL.outcome
INCOMPATIBLE = Verdict.INCOMPATIBLE.outcome
CORRUPT = Verdict.CORRUPT.outcome
ERROR = Verdict.ERROR.outcome
VERDICTS = tuple(v.outcome for v in LOAD_OUTCOMES)

# The load phases in the order they run (the dashboard draws them as one stacked bar).
LOAD_PHASES = ("read_verify", "validity", "deserialize", "create_context", "allocate_io", "first_inference")


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
    tolerances: Tolerances | None = None  # else the judged precision's, with `tolerance_overrides`
    tolerance_overrides: Mapping[str, float] | None = None  # as `tolerances_for` takes them
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
    inputs: dict[str, str] = field(default_factory=dict)  # how each input was made
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
            "inputs": self.inputs,
            "details": self.details,
        }


def read_engine(path: Path, *, sha256: str, blake3: str | None, timer: PhaseTimer) -> memoryview:
    """Read a blob into one buffer while verifying it (BLAKE3 when recorded, else sha256): phase `read_verify`."""
    with timer.phase("read_verify"):
        if not path.is_file():
            raise IntegrityCheckError(f"blob {path} is missing")
        if blake3:
            return read_verified(path, blake3_digest=blake3)
        return read_verified(path, sha256=sha256)


def prepare_inputs(spec: TestLoadSpec) -> tuple[dict[str, Any], dict[str, tuple[int, ...]], dict[str, str]]:
    """The feeds, their shapes and how each was made: the inputs file, else `core.inputs`' generator
    following the source model's graph. Raises TestInputError (inputs that do not fit, too large)."""
    shapes = input_shapes(spec.profiles, spec.io, spec.batch)
    if spec.inputs_path is not None:
        feeds = load_inputs(spec.inputs_path, spec.io)
        shapes = {name: tuple(int(d) for d in np.shape(value)) for name, value in feeds.items()}
        return feeds, shapes, {name: f"from {spec.inputs_path.name}" for name in feeds}
    hints = read_input_hints(spec.source_onnx, TestInputError)
    slots = engine_slots(spec.io, shapes)
    rules = {name: rule.describe() for name, rule in feed_rules(slots, hints).items()}
    feeds = generate_feed(slots, np.random.default_rng(spec.seed), TestInputError, hints)
    return feeds, shapes, rules


def _error(result: TestLoadResult, err: BaseException) -> TestLoadResult:
    result.verdict = ERROR
    result.reason = str(err) if isinstance(err, EngineCacheError) else f"{type(err).__name__}: {err}"
    result.details = {**result.details, "error_type": type(err).__name__}
    return result


def validate_engine(backend: Backend, spec: TestLoadSpec) -> TestLoadResult:
    """Run the whole test-load; every outcome once the inputs are made is a result with a verdict.

    Bad input (an inputs file that does not fit, a batch outside the profile, a declared shape too
    large to generate) raises TestInputError before the engine is read.
    """
    timer = PhaseTimer()
    quantized = source_arithmetic(spec.source_onnx) if spec.precision == "fp32" else None
    judged = quantized or spec.precision
    tolerances = spec.tolerances or tolerances_for(judged, spec.tolerance_overrides)
    feeds, shapes, made = prepare_inputs(spec)
    result = TestLoadResult(
        verdict=ERROR,
        reason="",
        tolerances=tolerances,
        input_shapes={k: list(v) for k, v in shapes.items()},
        inputs=made,
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
    except (EngineCacheError, MemoryError) as err:  # LoadFailedError, InferenceError, CudaError
        return _error(result, err)
    except Exception as err:  # the library's own exception classes (ONNX Runtime's are not RuntimeErrors)
        if not is_library_error(err):
            raise
        return _error(result, err)
    finally:
        if session is not None:
            session.close()
    first_shape: tuple[int, ...] = next(iter(shapes.values()), ())
    batch = int(first_shape[0]) if first_shape else 1
    if samples:
        result.latency = latency_stats(samples, batch)
        result.samples_ms = [s * 1000.0 for s in samples]
    result.details["reference"] = REFERENCE_PATH_QUANTIZED if quantized else REFERENCE_PATH
    if quantized:
        result.details["quantized_source"] = quantized
    try:
        reference = reference_outputs(spec.source_onnx, feeds, quantized=quantized is not None)
        result.accuracy = compare_outputs(outputs, reference, tolerances)
    except TestInputError as err:  # the reference cannot run these inputs, or the outputs do not match it
        return _error(result, err)
    _judge(result, judged)
    if quantized:
        result.reason += (
            f"; the source is already quantized ({quantized}): judged at its {quantized} tolerances against "
            "ONNX Runtime with its graph optimizations on (ORT_ENABLE_ALL), its integer kernels"
        )
    return result


def source_arithmetic(source_onnx: Path) -> str | None:
    """The quantized arithmetic of an already-quantized source ("int8" or "fp8",
    `onnx_quantized.quantized_arithmetic`), read without its weights; None for a float model, and
    where the source cannot be read (the reference run then says why)."""
    import onnx  # imported where a model is read
    from google.protobuf.message import DecodeError

    from enginecache.core.onnx_quantized import quantized_arithmetic

    try:
        model = onnx.load(str(source_onnx), load_external_data=False)
    except (OSError, ValueError, DecodeError):
        return None
    return quantized_arithmetic(model)


def _judge(result: TestLoadResult, precision: str) -> None:
    failed = [a for a in result.accuracy if not a.passed]
    if failed:
        result.verdict = FAIL
        result.reason = f"output(s) {', '.join(a.name for a in failed)} outside {precision} tolerances: " + "; ".join(
            check for a in failed for check in a.failed_checks[:3]
        )
        return
    scored = [a.top1 for a in result.accuracy if a.top1 is not None]
    top1 = f", min top-1 agreement {min(scored):.4f}" if scored else ""
    result.verdict = PASS
    result.reason = (
        f"{len(result.accuracy)} output(s) within {precision} tolerances "
        f"(min cosine {min((a.cosine for a in result.accuracy), default=1.0):.6f}{top1})"
    )


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
    "input_shapes",
    "random_inputs",
    "reference_outputs",
    "tolerances_for",
    "validate_engine",
]
