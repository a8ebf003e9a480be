"""What a worker can run, what a job needs, and the words for a job nobody can run yet."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from enginecache.core.fingerprint import HostFingerprint
from enginecache.db.models import EngineRecord

BACKEND_MODULES = {"rtx": "tensorrt_rtx", "trt": "tensorrt", "ort": "onnxruntime"}
BACKEND_LABELS = {"rtx": "TensorRT-RTX", "trt": "TensorRT", "ort": "ONNX Runtime"}
WORKER_ALIVE_SECONDS = 15.0  # a worker whose heartbeat is older is not counted as live


def worker_capabilities(host: HostFingerprint) -> dict[str, Any]:
    """Backends importable here (found without importing them) with their versions, GPUs, CPU
    target and OS."""
    backends = [name for name, module in BACKEND_MODULES.items() if importlib.util.find_spec(module) is not None]
    return {
        "backends": backends,
        "versions": {name: host.packages.get(BACKEND_MODULES[name]) for name in backends},
        "gpus": [{"name": g.name, "compute_capability": g.compute_capability} for g in host.gpus],
        "cpu_target": host.cpu_target,
        "os": host.os,
    }


def build_requirements(
    backend: str, target_info: Mapping[str, Any], backend_version: str, os_name: str
) -> dict[str, Any]:
    """rtx builds need only TensorRT-RTX (no GPU); trt needs the target GPU; ort the target CPU.
    Every build needs the exact backend version and OS of its cache key, so the engine a worker
    builds is the one that was asked for."""
    requirements: dict[str, Any] = {"backend": backend, "backend_version": backend_version, "os": os_name}
    if backend == "trt":
        requirements["compute_capability"] = target_info["compute_capability"]
    if backend == "ort":
        requirements["cpu_target"] = target_info["cpu"]
    return requirements


def load_requirements(engine: EngineRecord) -> dict[str, Any]:
    """What loading an engine needs: ort the CPU target it was optimized for; rtx the library and a
    GPU of one of the engine's compute capabilities; trt the GPU it was built on."""
    backend = engine.backend
    items = [t for t in engine.targets.split(",") if t]
    requirements: dict[str, Any] = {"backend": backend}
    if backend == "ort":
        requirements["cpu_target"] = items[0] if items else None
    elif backend == "rtx":
        requirements["compute_capability_any"] = items
    elif backend == "trt" and items:
        requirements["compute_capability"] = items[0]
    return requirements


def can_run(requirements: Mapping[str, Any], capabilities: Mapping[str, Any]) -> bool:
    backend = requirements.get("backend")
    if backend not in capabilities.get("backends", []):
        return False
    version = requirements.get("backend_version")
    if version is not None and (capabilities.get("versions") or {}).get(backend) != version:
        return False
    if requirements.get("os") not in (None, capabilities.get("os")):
        return False
    local_cc = {g["compute_capability"] for g in capabilities.get("gpus", [])}
    needed_cc = requirements.get("compute_capability")
    if needed_cc is not None and needed_cc not in local_cc:
        return False
    any_cc = requirements.get("compute_capability_any")
    if any_cc is not None and not local_cc.intersection(any_cc):
        return False
    needed_cpu = requirements.get("cpu_target")
    return needed_cpu is None or needed_cpu == capabilities.get("cpu_target")


def describe_requirements(requirements: Mapping[str, Any]) -> str:
    """'a worker with TensorRT and an SM86 GPU'."""
    label = BACKEND_LABELS.get(str(requirements.get("backend")), str(requirements.get("backend")))
    parts = [f"{label} {requirements['backend_version']}" if requirements.get("backend_version") else label]
    if "compute_capability" in requirements:
        parts.append(f"an {str(requirements['compute_capability']).upper()} GPU")
    if "compute_capability_any" in requirements:
        ccs = [str(cc).upper() for cc in requirements["compute_capability_any"]]
        parts.append(f"a GPU of {' or '.join(ccs)}" if ccs else "a GPU")
    if "cpu_target" in requirements:
        parts.append(f"a {requirements['cpu_target']} CPU")
    where = f" on {requirements['os']}" if requirements.get("os") else ""
    return "a worker with " + " and ".join(parts) + where
