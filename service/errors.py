"""Typed errors of the service layer."""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error raised by `service`."""


class BuildFailedError(ServiceError):
    """A build ran and failed; the FAILED engine record carries the backend's message."""

    def __init__(self, message: str, engine_id: int) -> None:
        super().__init__(message)
        self.engine_id = engine_id
