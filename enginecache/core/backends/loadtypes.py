"""The backend contract's value types a cache hit creates, light: no `dataclasses`, `typing` or numpy.

`core.backends.base` (the contract: the `Backend` and `EngineSession` protocols and the build-time
dataclasses) re-exports every name here; a serving process's load (`service.serving.engineload`, the
backends' `load` and sessions) imports them from this module, so a new process's cache hit does not
pay for `dataclasses` (`core.valuetype` says why). Each behaves as the frozen (`LoadSpec`,
`TensorIO`, `TritonInfo`) or plain (`PhaseTimer`) dataclass it was.
"""

from __future__ import annotations

import time

from enginecache.core.hashing import HEAD_BYTES
from enginecache.core.valuetype import Frozen, Mutable, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import TracebackType
    from typing import Any

    import numpy as np

# What `Backend.check_header` is given: an engine's first bytes (TensorRT's header is 64 bytes; an
# ORT-format model's identifier is at bytes 4..8): the prefix whose BLAKE3 the store records beside
# the blob's (`DigestResult.head_blake3`), so a load can check them before reading the rest.
ENGINE_HEADER_BYTES = HEAD_BYTES


class _Phase:
    """`PhaseTimer.phase`'s context manager (a class: `contextlib` is not imported for it)."""

    __slots__ = ("name", "phases", "started")

    def __init__(self, phases: dict[str, float], name: str) -> None:
        self.phases = phases
        self.name = name
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(
        self, _type: type[BaseException] | None, _value: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.phases[self.name] = self.phases.get(self.name, 0.0) + time.perf_counter() - self.started


class PhaseTimer(Mutable):
    """Seconds per named phase, in the order they ran (a phase run twice adds up)."""

    phases: dict[str, float] = field(default_factory=dict)

    def phase(self, name: str) -> _Phase:
        """`with timer.phase(name):` adds the block's seconds to `phases[name]`, also when it raises."""
        return _Phase(self.phases, name)

    def total(self) -> float:
        return sum(self.phases.values())


class LoadSpec(Frozen):
    """How to load: the shapes to prepare I/O for (the profile's opt shapes by default)."""

    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    label: str = "engine"
    backend_version: str | None = None  # the version that built it (checked where the format is tied to it)
    targets: tuple[str, ...] = ()
    # A TensorRT-RTX runtime cache file (chosen by core.runtimecache.select) to hand to the runtime;
    # other backends ignore it.
    runtime_cache: str | None = None


class TensorIO(Frozen):
    name: str
    mode: str  # "input" | "output"
    dtype: str
    shape: tuple[int | str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "mode": self.mode, "dtype": self.dtype, "shape": list(self.shape)}


class TritonInfo(Frozen):
    """How Triton Inference Server serves a backend's engines: what an export writes into config.pbtxt."""

    platform: str  # "tensorrt_plan" | "onnxruntime_onnx"
    backend: str | None  # Triton's backend where the config must name one ("onnxruntime"), else None
    instance_kind: str  # "KIND_GPU" | "KIND_CPU"
    file_suffix: str  # the model file's suffix in the version folder (".plan", ".ort")
    rank: int  # preference when an export names no backend: the lowest rank present is exported
    warning: str | None = None  # said with every Triton export of these engines (in its result and config.pbtxt)
    # Its engines keep the model's declared output shapes (ONNX Runtime merges them with its own
    # inference, leniently): an export takes output shapes from a shape inference of the graph instead.
    infer_output_shapes: bool = False


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for one of our dtype names (`float32`, `float16`, `int64`, `bool`, ...)."""
    import numpy as np

    return np.dtype("bool" if name == "bool" else name)
