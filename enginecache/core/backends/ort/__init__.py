"""The ONNX Runtime (CPU) backend: builder, session, targets and compatibility rule.

This `__init__` holds the backend's declaration only (`core.backends.registry` reads it without
importing the backend); the backend is `ort.backend`'s `ORT_BACKEND`.
"""

from enginecache.core.backends.declaration import BackendDeclaration

ORT = BackendDeclaration(
    backend="enginecache.core.backends.ort.backend:ORT_BACKEND",
    library="onnxruntime",
    distributions=("onnxruntime", "onnxruntime-gpu"),
    install_hint="ONNX Runtime is not installed: pip install onnxruntime",
    warm=True,
)
