"""Backends by name: the one place that lists them.

Each line of `_DECLARED` names where a backend's `BackendDeclaration` is (its package's `__init__`,
which imports nothing else of it); adding a backend is its package plus that one line. A backend
package outside enginecache adds its line at run time with `register_backend`. Modules that need a
backend's library names (the host fingerprint, worker capabilities and preload, install hints, the
accuracy check) ask `declarations()`, which imports the declarations alone; a backend's own module
is imported when that backend is first asked for (`get_backend`), so a serving process's cache hit
imports the one backend it loads with. `all_backends()` and `BACKENDS` import every one.
"""

from __future__ import annotations

from enginecache.errors import TargetError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from enginecache.core.backends.base import Backend
    from enginecache.core.backends.declaration import BackendDeclaration

    BACKENDS: dict[str, Backend]

# name -> "module:attribute" of its BackendDeclaration, in the order backends are listed
_DECLARED: dict[str, str] = {
    "rtx": "enginecache.core.backends.trt:RTX",
    "trt": "enginecache.core.backends.trt:TRT",
    "ort": "enginecache.core.backends.ort:ORT",
}
_LOADED: dict[str, Backend] = {}


def _attribute(where: str) -> object:
    """The object "module:attribute" names, its module imported (`__import__` is importlib's work here)."""
    module, _, attribute = where.partition(":")
    return getattr(__import__(module, fromlist=[attribute]), attribute)


def register_backend(name: str, declared: str) -> None:
    """Add a backend from a package outside enginecache, listed after the others: `declared` is
    "module:attribute" of its `BackendDeclaration` (as a line of `_DECLARED`). Registered in this
    process; raises TargetError where `name` is taken."""
    if name in _DECLARED:
        raise TargetError(f"a backend named {name!r} is registered already")
    _DECLARED[name] = declared


def declaration(name: str) -> BackendDeclaration:
    """What backend `name` declares (imports its declaration, not its backend)."""
    where = _DECLARED.get(name)
    if where is None:
        raise TargetError(f"unknown backend {name!r}: choose one of {', '.join(_DECLARED)}")
    declared: BackendDeclaration = _attribute(where)  # type: ignore[assignment]
    return declared


def declarations() -> tuple[BackendDeclaration, ...]:
    """Every backend's declaration, in the order backends are listed."""
    return tuple(declaration(name) for name in _DECLARED)


def get_backend(name: str) -> Backend:
    backend = _LOADED.get(name)
    if backend is not None:
        return backend
    loaded: Backend = _attribute(declaration(name).backend)  # type: ignore[assignment]
    _LOADED[name] = loaded
    return loaded


def all_backends() -> tuple[Backend, ...]:
    return tuple(get_backend(name) for name in _DECLARED)


def backend_label(name: str) -> str:
    """'TensorRT-RTX' for 'rtx'; an unknown name as it is."""
    return get_backend(name).label if name in _DECLARED else name


def __getattr__(name: str) -> object:
    if name == "BACKENDS":  # every backend by name (imports each backend's module)
        return {key: get_backend(key) for key in _DECLARED}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
