"""Backends by name: the one place that lists them."""

from __future__ import annotations

from enginecache.core.backends.base import Backend
from enginecache.core.backends.ort import ORT_BACKEND
from enginecache.core.backends.trt import RTX_BACKEND, TRT_BACKEND
from enginecache.errors import TargetError

BACKENDS: dict[str, Backend] = {"rtx": RTX_BACKEND, "trt": TRT_BACKEND, "ort": ORT_BACKEND}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise TargetError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}") from None


def all_backends() -> tuple[Backend, ...]:
    return tuple(BACKENDS.values())


def backend_label(name: str) -> str:
    """'TensorRT-RTX' for 'rtx'; an unknown name as it is."""
    backend = BACKENDS.get(name)
    return backend.label if backend is not None else name
