"""TensorRT and TensorRT for RTX: builder, session, targets, compatibility rule, CUDA helpers.

This `__init__` holds the two backends' declarations only (`core.backends.registry` reads them
without importing the backends); the backends are `trt.backend`'s `RTX_BACKEND` and `TRT_BACKEND`.
"""

from enginecache.core.backends.declaration import BackendDeclaration

# The CUDA Python packages a TensorRT session uses (`trt.cuda`): their errors are the library's too.
_CUDA_MODULES = ("cuda", "pycuda")

RTX = BackendDeclaration(
    backend="enginecache.core.backends.trt.backend:RTX_BACKEND",
    library="tensorrt_rtx",
    distributions=("tensorrt-rtx", "tensorrt_rtx_cu13", "tensorrt_rtx_cu12"),
    install_hint="TensorRT for RTX is not installed: pip install tensorrt-rtx",
    error_modules=_CUDA_MODULES,
    warm=True,
)
TRT = BackendDeclaration(
    backend="enginecache.core.backends.trt.backend:TRT_BACKEND",
    library="tensorrt",
    distributions=("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_cu13_libs", "tensorrt_cu12_libs"),
    install_hint=(
        "TensorRT is not installed on this host: install it from NVIDIA's package index "
        "(pip install 'enginecache[tensorrt]' --extra-index-url https://pypi.nvidia.com) or use an "
        "NGC TensorRT container; it needs an NVIDIA GPU to build"
    ),
    error_modules=("tensorrt_bindings", *_CUDA_MODULES),
)
