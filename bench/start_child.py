"""One serving start in a new process, the way bench/bench_start.py times it.

    python bench/start_child.py MODE ARGS...

It prints `BENCH_READY <time.perf_counter()>` when what a serving process waits for is there, and
`BENCH_JSON {...}` with what it timed itself (`t0`: the first line of this script ran) and the memory
it holds then (`rss_ready_bytes`, read after the ready line), then exits.
Only the modes that need enginecache import it, and each floor imports only what it uses. Modes:

- hit MODEL BACKEND [TARGET]: `load_or_build(MODEL, spec=RuntimeSpec(backend=..., targets=...),
  on_miss="fail")`; ready when the session is in hand, or (rtx on a host without a supported GPU)
  when EngineRejectedError INCOMPATIBLE is raised. BENCH_JSON: import seconds and load phases.
- floor_ort BLOB: `import onnxruntime` and an `InferenceSession` of the stored ORT-format engine
  (by path, CPU provider), what a serving process without enginecache does.
- floor_rtx BLOB: `import tensorrt_rtx`, a Runtime, the engine file read (as a user's own
  `deserialize_cuda_engine(open(path).read())` starts) and `get_engine_validity` on its header.
- rehash BLOB FILE...: what a cache keyed on file content without a stat cache does at every start:
  sha256 of every FILE (the ONNX and its external data), then floor_ort's load of BLOB.
- parse ONNX BLOB: what ONNX Runtime's TensorRT execution provider does at every session start to
  find its engine: `onnx.load` of the model (external data included) and a hash of its node names,
  then floor_ort's load of BLOB.
- fingerprint: `host_fingerprint()` of a new process (BENCH_JSON: import and call seconds).
- noop: nothing (the interpreter's own start, the floor of the fingerprint).

bench/bench_start.py runs it with an interpreter that sees the checkout as a regular install
(`harness.installed_python`), not through an editable install's finder.
"""

from __future__ import annotations

import json
import os
import sys
import time

T0 = time.perf_counter()
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (the floors pay for nothing)
if TYPE_CHECKING:
    from typing import Any
# The checkout first (as bench/read_child.py does): a script's folder is sys.path[0], not the checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def ready(**extra: object) -> float:
    now = time.perf_counter()
    print(f"BENCH_READY {now}", flush=True)
    held = _resident_bytes()  # what the process holds once ready (its peak is the harness's maxrss)
    print("BENCH_JSON " + json.dumps({"t0": T0, "ready_at": now, "rss_ready_bytes": held, **extra}), flush=True)
    return now


def _resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def hit(model: str, backend: str, target: str = "") -> None:
    from enginecache import EngineRejectedError, RuntimeSpec, load_or_build

    imported = time.perf_counter()
    spec = RuntimeSpec(backend=backend, targets=(target,) if target else ())
    try:
        engine = load_or_build(model, spec=spec, on_miss="fail")
    except EngineRejectedError as err:
        if err.verdict != "INCOMPATIBLE":
            raise
        ready(import_s=imported - T0, verdict=err.verdict, modules=_heavy_modules())
        print("BENCH_JSON " + json.dumps({"phases": _last_event_phases(), "via": _last_via()}), flush=True)
        return
    ready(import_s=imported - T0, phases=engine.phases, via=engine.via, modules=_heavy_modules())


def _last_event_phases() -> dict[str, float]:
    """The phases of the load event just recorded (a rejection carries none of its own); read after
    the verdict was taken, so it is not in the time measured."""
    import sqlite3
    from pathlib import Path

    home = Path(os.environ.get("ENGINECACHE_HOME") or "engines")
    with sqlite3.connect(home / "catalog.db") as connection:
        row = connection.execute("SELECT phases FROM load_events ORDER BY id DESC LIMIT 1").fetchone()
    return json.loads(row[0]) if row else {}


def _last_via() -> str:
    return "fullpath" if "enginecache.service.serving.loadpath" in sys.modules else "hitpath"


def _heavy_modules() -> list[str]:
    return [m for m in ("sqlalchemy", "sqlmodel", "alembic", "onnx", "pydantic", "numpy", "pynvml") if m in sys.modules]


def _ort_session(blob: str) -> Any:
    """`InferenceSession` of the stored ORT-format engine by path, CPU provider: the floor's load."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_session_config_entry("session.load_model_format", "ORT")
    return ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])


def floor_ort(blob: str) -> None:
    import onnxruntime  # noqa: F401 - timed apart from the session

    imported = time.perf_counter()
    session = _ort_session(blob)
    ready(import_s=imported - T0, inputs=len(session.get_inputs()))


def rehash(blob: str, *files: str) -> None:
    import hashlib

    for name in files:
        with open(name, "rb") as stream:
            hashlib.file_digest(stream, "sha256")
    hashed = time.perf_counter()
    session = _ort_session(blob)
    ready(hash_s=hashed - T0, inputs=len(session.get_inputs()))


def parse(model: str, blob: str) -> None:
    import hashlib

    import onnx

    graph = onnx.load(model).graph  # external data loaded, as a session of the model would
    hashlib.sha256("\n".join(node.name or node.op_type for node in graph.node).encode()).hexdigest()
    parsed = time.perf_counter()
    session = _ort_session(blob)
    ready(parse_s=parsed - T0, inputs=len(session.get_inputs()))


def floor_rtx(blob: str) -> None:
    import tensorrt_rtx as trt

    imported = time.perf_counter()
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    with open(blob, "rb") as stream:
        engine = stream.read()
    validity, _mask = runtime.get_engine_validity(engine[: runtime.engine_header_size])
    ready(import_s=imported - T0, validity=str(validity))


def fingerprint() -> None:
    from enginecache.core.fingerprint import host_fingerprint

    imported = time.perf_counter()
    host = host_fingerprint()
    done = time.perf_counter()
    ready(import_s=imported - T0, call_s=done - imported, total_s=done - T0, nvml=host.nvml)


def noop() -> None:
    ready()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    modes = {"hit": hit, "floor_ort": floor_ort, "floor_rtx": floor_rtx, "rehash": rehash, "parse": parse}
    {**modes, "fingerprint": fingerprint, "noop": noop}[mode](*args)
