"""TensorRT's DataType names in ours."""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

_DTYPES = {
    "FLOAT": "float32",
    "HALF": "float16",
    "BF16": "bfloat16",
    "INT8": "int8",
    "INT32": "int32",
    "INT64": "int64",
    "BOOL": "bool",
    "UINT8": "uint8",
    "FP8": "float8e4m3fn",
    "INT4": "int4",
    "FP4": "float4e2m1",
}


def dtype_name(dtype: Any) -> str:
    name = getattr(dtype, "name", str(dtype))
    return _DTYPES.get(name, name.lower())
