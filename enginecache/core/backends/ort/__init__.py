"""The ONNX Runtime (CPU) backend: builder, session, targets and compatibility rule."""

from enginecache.core.backends.ort.backend import ORT_BACKEND, OnnxRuntimeBackend

__all__ = ["ORT_BACKEND", "OnnxRuntimeBackend"]
