"""The one place GPU and backend libraries are imported: lazily, with a typed install hint.

Backends, the CUDA helpers and the validation harness all import their libraries through
`import_backend`, so a missing library is always a `BackendUnavailableError` saying how to install it.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from enginecache.errors import BackendUnavailableError

INSTALL_HINTS: dict[str, str] = {
    "tensorrt": (
        "TensorRT is not installed on this host: install it from NVIDIA's package index "
        "(pip install 'enginecache[tensorrt]' --extra-index-url https://pypi.nvidia.com) or use an "
        "NGC TensorRT container; it needs an NVIDIA GPU to build"
    ),
    "tensorrt_rtx": "TensorRT for RTX is not installed: pip install tensorrt-rtx",
    "onnxruntime": "ONNX Runtime is not installed: pip install onnxruntime",
    "pynvml": "NVML bindings are not installed: pip install 'enginecache[gpu]'",
    "cuda.bindings": "cuda-python is not installed: pip install 'enginecache[gpu]'",
}


def import_backend(module: str) -> ModuleType:
    """Import a backend library or raise BackendUnavailableError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        hint = INSTALL_HINTS.get(module, f"{module} is not installed")
        raise BackendUnavailableError(f"{hint} ({err})") from err
