"""TensorRT and TensorRT for RTX: builder, session, targets, compatibility rule, CUDA helpers."""

from enginecache.core.backends.trt.backend import RTX_BACKEND, TRT_BACKEND, TensorRTBackend

__all__ = ["RTX_BACKEND", "TRT_BACKEND", "TensorRTBackend"]
