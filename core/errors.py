"""Typed errors of the core layer: one base, one class per kind of failure."""

from __future__ import annotations


class CoreError(Exception):
    """Base of every error raised by `core`."""


class InvalidModelError(CoreError):
    """The file is not a usable ONNX model (missing, empty, truncated, not ONNX)."""


class ExternalDataError(InvalidModelError):
    """An external data reference is unsafe (absolute, `..`, symlink, escapes) or missing."""


class ProfileError(CoreError):
    """An optimization profile does not match the model's inputs."""


class TargetError(CoreError):
    """An unknown or unsupported build target."""


class PrecisionError(CoreError):
    """An unknown precision, or a precision conversion that failed."""


class CalibrationError(PrecisionError):
    """Calibration data that does not match the model's inputs."""


class BackendUnavailableError(CoreError):
    """A backend library (TensorRT, TensorRT-RTX, ONNX Runtime) is not importable here."""


class BuildError(CoreError):
    """The backend failed to build an engine; the message carries the backend's own words."""


class StoreError(CoreError):
    """The artifact store could not write or read a blob."""


class IntegrityError(StoreError):
    """A blob's bytes do not match its recorded digest."""


class BuildOptionError(CoreError):
    """A build option (optimization level, workspace, ...) outside what the backend takes."""
