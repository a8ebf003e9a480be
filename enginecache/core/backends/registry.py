"""Backends by name: the one place that lists them.

A backend's module is imported when that backend is first asked for (`get_backend`), so a serving
process's cache hit imports the one backend it loads with; `BACKENDS` and `all_backends()` import
every one.
"""

from __future__ import annotations

from enginecache.errors import TargetError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from enginecache.core.backends.base import Backend

    BACKENDS: dict[str, Backend]

# name -> (module, attribute), in the order they are listed
_WHERE: dict[str, tuple[str, str]] = {
    "rtx": ("enginecache.core.backends.trt.backend", "RTX_BACKEND"),
    "trt": ("enginecache.core.backends.trt.backend", "TRT_BACKEND"),
    "ort": ("enginecache.core.backends.ort.backend", "ORT_BACKEND"),
}
_LOADED: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    backend = _LOADED.get(name)
    if backend is not None:
        return backend
    where = _WHERE.get(name)
    if where is None:
        raise TargetError(f"unknown backend {name!r}: choose one of {', '.join(_WHERE)}")
    module, attribute = where
    loaded: Backend = getattr(__import__(module, fromlist=[attribute]), attribute)
    _LOADED[name] = loaded
    return loaded


def all_backends() -> tuple[Backend, ...]:
    return tuple(get_backend(name) for name in _WHERE)


def backend_label(name: str) -> str:
    """'TensorRT-RTX' for 'rtx'; an unknown name as it is."""
    return get_backend(name).label if name in _WHERE else name


def __getattr__(name: str) -> object:
    if name == "BACKENDS":  # every backend by name (imports each backend's module)
        backends = {key: get_backend(key) for key in _WHERE}
        globals()["BACKENDS"] = backends
        return backends
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
