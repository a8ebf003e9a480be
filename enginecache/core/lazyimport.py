"""The one place GPU and backend libraries are imported: lazily, with a typed install hint.

Backends, the CUDA helpers and the validation harness all import their libraries through
`import_backend`, so a missing library is always a `BackendUnavailableError` saying how to install it
(a backend's hint is its declaration's); `importable` says whether one could be, without importing it.

Neither imports `importlib`: a cache hit's new process calls both, and neither tensorrt_rtx nor
onnxruntime imports `importlib.util` (its cost to a hit: docs/performance.md, "The import diet").
"""

from __future__ import annotations

import sys
from types import ModuleType

from enginecache.errors import BackendUnavailableError

# Install hints of the libraries no backend declares (a backend passes its own: `BackendDeclaration`).
INSTALL_HINTS: dict[str, str] = {
    "pynvml": "NVML bindings are not installed: pip install 'enginecache[gpu]'",
    "cuda.bindings": "cuda-python is not installed: pip install 'enginecache[gpu]'",
}


def import_backend(module: str, hint: str | None = None) -> ModuleType:
    """Import a backend library or raise BackendUnavailableError saying how to install it (`hint`,
    else `INSTALL_HINTS`' for the module)."""
    try:
        __import__(module)  # importlib.import_module's work: for "a.b" it returns "a", so take sys.modules'
    except ImportError as err:
        hint = hint or INSTALL_HINTS.get(module, f"{module} is not installed")
        raise BackendUnavailableError(f"{hint} ({err})") from err
    return sys.modules[module]


def importable(name: str) -> bool:
    """`importlib.util.find_spec(name) is not None` for a top-level module name, without importing
    importlib.util: a module already imported is importable (a `None` placeholder in sys.modules is
    not), else the import system's finders (`sys.meta_path`) are asked in their order, as an import
    would ask them; nothing is imported."""
    if "." in name:
        raise ValueError(f"importable() takes a top-level module name, not {name!r}")
    if name in sys.modules:
        return sys.modules[name] is not None
    for finder in sys.meta_path:
        find_spec = getattr(finder, "find_spec", None)
        if find_spec is not None and find_spec(name, None) is not None:
            return True
    return False
