"""TensorRT's process-wide logger and its progress monitor, adapted to our callbacks."""

from __future__ import annotations

import _thread
import contextlib
import sys

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:  # the contract (`base`: dataclasses) is imported where a build needs it
    from collections.abc import Iterator
    from types import ModuleType
    from typing import Any

    from enginecache.core.backends.base import LogCallback, ProgressCallback

# TensorRT keeps one process-wide logger: one build at a time. `threading.Lock` is this lock; the
# `_thread` builtin gives it without importing `threading`, which a cache hit does not otherwise need.
_BUILD_LOCK = _thread.allocate_lock()
_LOGGERS: dict[str, Any] = {}


def capturing_logger(trt: ModuleType) -> Any:
    """The process-wide logger for `trt`, created once, whose lines go to a swappable sink."""
    existing = _LOGGERS.get(trt.__name__)
    if existing is not None:
        return existing

    class CapturingLogger(trt.ILogger):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.sink: list[str] = []
            self.listener: LogCallback | None = None

        def log(self, severity: Any, msg: str) -> None:
            name = getattr(severity, "name", str(severity))
            line = f"[{name}] {msg}"
            self.sink.append(line)
            if self.listener is not None:
                self.listener(line)
            logging = sys.modules.get("logging")  # not imported: nothing is configured to show it
            if logging is not None and name in ("ERROR", "INTERNAL_ERROR"):
                logging.getLogger(__name__).debug("%s: %s", trt.__name__, msg)

    instance = CapturingLogger()
    _LOGGERS[trt.__name__] = instance
    return instance


def progress_monitor(trt: ModuleType, callback: ProgressCallback) -> Any:
    from enginecache.core.backends.base import ProgressEvent

    class Monitor(trt.IProgressMonitor):  # type: ignore[misc, name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            callback(ProgressEvent("start", phase_name, parent=parent_phase, steps=num_steps))

        def step_complete(self, phase_name: str, step: int) -> bool:
            callback(ProgressEvent("step", phase_name, step=step))
            return True

        def phase_finish(self, phase_name: str) -> None:
            callback(ProgressEvent("finish", phase_name))

    return Monitor()


@contextlib.contextmanager
def captured(trt: ModuleType, listener: LogCallback | None = None) -> Iterator[tuple[Any, list[str]]]:
    """The process-wide logger with a fresh sink (and listener) for one build or load; TensorRT keeps
    one logger per process, so builds and loads in a process take turns."""
    with _BUILD_LOCK:
        sink: list[str] = []
        trt_logger = capturing_logger(trt)
        trt_logger.sink = sink
        trt_logger.listener = listener
        try:
            yield trt_logger, sink
        finally:
            trt_logger.sink = []
            trt_logger.listener = None
