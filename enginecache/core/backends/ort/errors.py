"""The exceptions ONNX Runtime raises: its binding's own classes (`Fail`, `InvalidGraph`,
`InvalidArgument`, ...) derive from `Exception`, not from RuntimeError or ValueError, so a bare
`except RuntimeError` lets them escape raw. Every call into ORT catches `ort_errors(ort)`."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from types import ModuleType

_BINDING_ERRORS = (
    "Fail",
    "InvalidArgument",
    "NoSuchFile",
    "NoModel",
    "EngineError",
    "RuntimeException",
    "InvalidProtobuf",
    "ModelLoaded",
    "NotImplemented",
    "InvalidGraph",
    "EPFail",
)


def ort_errors(ort: ModuleType) -> tuple[type[Exception], ...]:
    """RuntimeError, ValueError and every exception class ONNX Runtime's binding defines."""
    state = getattr(getattr(ort, "capi", None), "onnxruntime_pybind11_state", None)
    found = [getattr(state, name, None) for name in _BINDING_ERRORS]
    return (RuntimeError, ValueError, *[cls for cls in found if isinstance(cls, type) and issubclass(cls, Exception)])
