"""What a worker can run, what a job needs, and the words for a job nobody can run yet."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from core.fingerprint import HostFingerprint

BACKEND_MODULES = {"rtx": "tensorrt_rtx", "trt": "tensorrt", "ort": "onnxruntime"}
BACKEND_LABELS = {"rtx": "TensorRT-RTX", "trt": "TensorRT", "ort": "ONNX Runtime"}


def worker_capabilities(host: HostFingerprint) -> dict[str, Any]:
    """Backends importable here (found without importing them), GPUs, CPU target."""
    backends = [name for name, module in BACKEND_MODULES.items() if importlib.util.find_spec(module) is not None]
    return {
        "backends": backends,
        "gpus": [{"name": g.name, "compute_capability": g.compute_capability} for g in host.gpus],
        "cpu_target": host.cpu_target,
    }


def build_requirements(backend: str, target_info: Mapping[str, Any]) -> dict[str, Any]:
    """rtx builds need only TensorRT-RTX (no GPU); trt needs the target GPU; ort the target CPU."""
    requirements: dict[str, Any] = {"backend": backend}
    if backend == "trt":
        requirements["compute_capability"] = target_info["compute_capability"]
    if backend == "ort":
        requirements["cpu_target"] = target_info["cpu"]
    return requirements


def can_run(requirements: Mapping[str, Any], capabilities: Mapping[str, Any]) -> bool:
    if requirements.get("backend") not in capabilities.get("backends", []):
        return False
    needed_cc = requirements.get("compute_capability")
    if needed_cc is not None and needed_cc not in {g["compute_capability"] for g in capabilities.get("gpus", [])}:
        return False
    needed_cpu = requirements.get("cpu_target")
    return needed_cpu is None or needed_cpu == capabilities.get("cpu_target")


def describe_requirements(requirements: Mapping[str, Any]) -> str:
    """'a worker with TensorRT and an SM86 GPU'."""
    parts = [BACKEND_LABELS.get(str(requirements.get("backend")), str(requirements.get("backend")))]
    if "compute_capability" in requirements:
        parts.append(f"an {str(requirements['compute_capability']).upper()} GPU")
    if "cpu_target" in requirements:
        parts.append(f"a {requirements['cpu_target']} CPU")
    return "a worker with " + " and ".join(parts)
