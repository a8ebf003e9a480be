"""What enginecache sees on a real NVIDIA GPU host (run on the lent H200; writes one JSON file).

Checks, each with the product's own code paths:
- the host fingerprint through NVML and cuda-python (GPU name, UUID, compute capability, memory,
  driver, CUDA runtime);
- a TensorRT-RTX engine built (CPU-only AOT) for SM86 and the library's default set, then
  `check` and a test-load here: TensorRT-RTX refuses SM90, and the verdict must carry its own
  diagnostic (EngineInvalidityDiagnostics UNSUPPORTED_CC = 2), recorded, not raised;
- an ONNX Runtime engine test-loaded for real (PASS);
- core.cuda device buffers: host -> device -> host round trip of 64 MiB.

Usage: python bench/gpu_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from enginecache.core.fingerprint import host_fingerprint  # noqa: E402
from enginecache.service.builds.plan import BuildRequest, build_engine  # noqa: E402
from enginecache.service.builds.testload import run_test_load  # noqa: E402
from enginecache.service.context import AppContext  # noqa: E402
from enginecache.service.engines.loadruns import load_run_to_dict  # noqa: E402
from enginecache.service.engines.records import check_engine  # noqa: E402
from enginecache.service.models.register import register_model  # noqa: E402
from tests.modelfactory import make_conv  # noqa: E402


def cuda_roundtrip() -> dict[str, Any]:
    from enginecache.core.backends.trt.cuda import DeviceBuffer, Stream

    host = np.random.default_rng(0).standard_normal(16 * 1024 * 1024).astype(np.float32)
    back = np.empty_like(host)
    stream = Stream()
    buffer = DeviceBuffer(host.nbytes)
    started = time.perf_counter()
    buffer.copy_from_host(host, stream)
    buffer.copy_to_host(back, stream)
    stream.synchronize()
    seconds = time.perf_counter() - started
    buffer.free()
    stream.close()
    return {"bytes": int(host.nbytes), "equal": bool(np.array_equal(host, back)), "seconds": seconds}


def main() -> None:
    out = Path(sys.argv[1])
    report: dict[str, Any] = {}
    fingerprint = host_fingerprint(probe_cuda_runtime=True)
    report["fingerprint"] = fingerprint.to_dict()
    with tempfile.TemporaryDirectory() as tmp:
        app = AppContext.from_settings(Path(tmp) / "home")
        register_model(app, make_conv(Path(tmp) / "conv.onnx"), name="conv")
        engines = {
            "rtx_sm86": BuildRequest(model="conv", backend="rtx", targets=("sm86",)),
            "rtx_default": BuildRequest(model="conv", backend="rtx"),
            "ort": BuildRequest(model="conv", backend="ort"),
        }
        for label, request in engines.items():
            entry: dict[str, Any] = {}
            try:
                engine = build_engine(app, request, host=fingerprint).engine
                entry["engine"] = {"id": engine.id, "targets": engine.targets, "size_bytes": engine.size_bytes}
                entry["check"] = check_engine(app, engine.id or 0, host=fingerprint).to_dict()
                run = run_test_load(app, engine.id or 0, iterations=20, host=fingerprint)
                entry["test_load"] = load_run_to_dict(run)
            except Exception as err:  # noqa: BLE001 - the probe reports every failure it meets
                entry["error"] = f"{type(err).__name__}: {err}"
                entry["traceback"] = traceback.format_exc()
            report[label] = entry
        app.close()
    try:
        report["cuda_roundtrip"] = cuda_roundtrip()
    except Exception as err:  # noqa: BLE001
        report["cuda_roundtrip"] = {"error": f"{type(err).__name__}: {err}"}
    out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(
        json.dumps(
            {
                k: (v.get("check"), (v.get("test_load") or {}).get("verdict"), v.get("error"))
                if isinstance(v, dict) and k != "fingerprint" and k != "cuda_roundtrip"
                else None
                for k, v in report.items()
            },
            indent=1,
            default=str,
        )
    )
    print("gpus:", [(g["name"], g["compute_capability"]) for g in report["fingerprint"]["gpus"]])
    print("cuda:", report["cuda_roundtrip"])


if __name__ == "__main__":
    main()
