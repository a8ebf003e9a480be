"""ONNX Runtime's tensor type strings and shapes in our names."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

_ORT_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(bfloat16)": "bfloat16",
    "tensor(double)": "float64",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(bool)": "bool",
}


def ort_dtype(type_name: str) -> str:
    return _ORT_TYPES.get(type_name, type_name.removeprefix("tensor(").removesuffix(")"))


def ort_shape(shape: Any) -> tuple[int | str, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in shape)
