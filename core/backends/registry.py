"""Backends by name."""

from __future__ import annotations

from core.backends.base import Backend
from core.backends.ort import ORT_BACKEND
from core.backends.trt import RTX_BACKEND, TRT_BACKEND
from core.errors import TargetError

BACKENDS: dict[str, Backend] = {"rtx": RTX_BACKEND, "trt": TRT_BACKEND, "ort": ORT_BACKEND}


def get_backend(name: str) -> Backend:
    try:
        return BACKENDS[name]
    except KeyError:
        raise TargetError(f"unknown backend {name!r}: choose one of {', '.join(BACKENDS)}") from None
