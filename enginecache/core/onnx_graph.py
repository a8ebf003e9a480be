"""What an ONNX graph holds, read from its proto without loading weights: tensors and their
types, every (sub)graph and node, external data references (validated), parameters and op counts."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto

from enginecache.errors import ExternalDataError

UNKNOWN_DIM = "?"

# Element widths in bits for the packed sub-byte types (numpy's itemsize says 1 for these).
_SUB_BYTE_BITS: dict[int, int] = {
    TensorProto.UINT4: 4,
    TensorProto.INT4: 4,
    TensorProto.FLOAT4E2M1: 4,
}
for _name, _bits in (("UINT2", 2), ("INT2", 2), ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6)):
    _value = getattr(TensorProto, _name, None)  # newer types; absent in older onnx
    if isinstance(_value, int):
        _SUB_BYTE_BITS[_value] = _bits


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: name, numpy-style dtype and shape.

    ``shape`` holds ints for fixed dims and strings for symbolic ones (``"batch"``,
    ``"unk__214"``, ``"floor(...)"``) or ``"?"`` for an unknown dim (``-1`` or unset).
    Non-tensor values (sequence, map, optional) have ``shape == ()`` and a dtype such as
    ``"sequence(float32)"``; the checker requires main-graph tensor IO to declare a shape.
    """

    name: str
    dtype: str
    shape: tuple[int | str, ...]

    @property
    def is_dynamic(self) -> bool:
        """True when any dim is not a fixed int."""
        return any(not isinstance(d, int) for d in self.shape)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "shape": list(self.shape), "dynamic": self.is_dynamic}


# ---------------------------------------------------------------------------------------------
# Graph walking and external data
# ---------------------------------------------------------------------------------------------


def walk(roots: Iterable[GraphProto]) -> Iterator[GraphProto]:
    """`roots` and every subgraph nested in their nodes (If/Loop/Scan bodies), iteratively."""
    stack = list(roots)
    while stack:
        graph = stack.pop()
        yield graph
        for node in graph.node:
            stack.extend(subgraphs(node))


def iter_graphs(model: ModelProto) -> Iterator[GraphProto]:
    """The main graph and all its subgraphs."""
    return walk([model.graph])


def subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def all_nodes(model: ModelProto) -> Iterator[NodeProto]:
    """Nodes of the main graph, of model-local functions, and of all their subgraphs."""
    for graph in all_graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def all_graphs(model: ModelProto) -> Iterator[GraphProto]:
    """The main graph, subgraphs of model-local functions, and everything nested in them."""
    function_graphs = [sub for f in model.functions for n in f.node for sub in subgraphs(n)]
    return walk([model.graph, *function_graphs])


def all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto that may carry data: initializers and tensor attributes."""
    for graph in all_graphs(model):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
    for node in all_nodes(model):
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("sparse_tensor"):
                yield attr.sparse_tensor.values
                yield attr.sparse_tensor.indices
            for sparse in attr.sparse_tensors:
                yield sparse.values
                yield sparse.indices


@dataclass(frozen=True)
class ExternalExtent:
    """Where a tensor's bytes sit in its external file, as the model writes it (``offset`` and
    ``length`` are the raw strings; "" where absent), and how many bytes its dims and type need
    (None where they do not say: strings, unknown types)."""

    offset: str
    length: str
    needs: int | None


# What `resolve_refs` takes: (tensor name, location, extent); extent None checks the location only.
ExternalRef = tuple[str, str, ExternalExtent | None]


def external_refs(model: ModelProto) -> Iterator[ExternalRef]:
    """(tensor name, location, extent) for each externally stored tensor; nothing is parsed or
    checked here (`resolve_refs` does both, with the file at hand)."""
    for tensor in all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        extent = ExternalExtent(info.get("offset", ""), info.get("length", ""), _needed_bytes(tensor))
        yield tensor.name, info.get("location", ""), extent


def _needed_bytes(tensor: TensorProto) -> int | None:
    """The bytes a tensor's dims and element type need as raw data, or None where they do not say."""
    if tensor.data_type in (TensorProto.UNDEFINED, TensorProto.STRING) or any(d < 0 for d in tensor.dims):
        return None
    count, nbytes = tensor_size(tensor)
    return None if count and not nbytes else nbytes  # an element type of unknown width


def normalise_location(location: str) -> str:
    return PurePosixPath(location).as_posix()


def resolve_refs(model_path: Path, refs: Sequence[ExternalRef]) -> list[Path]:
    """Validate each reference and return its file's path, one per reference, in order.

    The location must be a relative posix path without ``..`` that passes through no symlink inside
    the model's folder, stays inside it and names a regular file. With an extent, the offset and
    length must be non-negative decimal integers inside that file (offset + length <= its size; an
    offset alone < its size), and the length must be the bytes the tensor's dims and type need.
    Raises `ExternalDataError` naming the model, the tensor, the location and the bad value."""
    folder = model_path.absolute().parent
    real_folder = folder.resolve()
    sizes: dict[str, tuple[Path, int]] = {}  # location -> (file, size): each file checked once
    out: list[Path] = []
    for tensor, location, extent in refs:

        def fail(problem: str, tensor: str = tensor, location: str = location) -> ExternalDataError:
            who = f"tensor {tensor!r} external data" if tensor else "external data"
            return ExternalDataError(f"{model_path}: {who} location {location!r} {problem}")

        if location not in sizes:
            candidate = _check_location(location, folder, real_folder, fail)
            sizes[location] = (candidate, candidate.stat().st_size)
        candidate, size = sizes[location]
        if extent is not None:
            problem = _extent_problem(extent, size, candidate.name)
            if problem is not None:
                raise fail(problem)
        out.append(candidate)
    return out


def _check_location(location: str, folder: Path, real_folder: Path, fail: Callable[[str], ExternalDataError]) -> Path:
    if not location:
        raise fail("is empty")
    if "\x00" in location:
        raise fail("contains a NUL byte")
    if location.startswith(("/", "\\")) or PureWindowsPath(location).drive:
        raise fail("is an absolute path; it must be relative to the model's folder")
    if "\\" in location:
        raise fail("contains a backslash; external data locations are posix paths")
    parts = [p for p in location.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise fail("contains '..'; it must stay inside the model's folder")
    if not parts:
        raise fail("does not name a file")
    candidate = folder
    for part in parts:
        candidate = candidate / part
        if candidate.is_symlink():
            raise fail(f"goes through a symlink ({candidate}); symlinks are not followed")
    if not candidate.exists():
        raise fail(f"names a missing file: {candidate} does not exist")
    if not candidate.is_file():
        raise fail(f"is not a regular file: {candidate}")
    real = candidate.resolve()
    if not real.is_relative_to(real_folder):
        raise fail(f"resolves outside the model's folder {real_folder}: {real}")
    return candidate


_DECIMAL = re.compile(r"[0-9]+")


def _extent_problem(extent: ExternalExtent, size: int, file: str) -> str | None:
    """Why `extent` does not fit a `size`-byte `file`, or None."""
    for key, text in (("offset", extent.offset), ("length", extent.length)):
        if text and _DECIMAL.fullmatch(text) is None:
            return f"has {key} {text!r}, which is not a non-negative integer"
    offset = int(extent.offset) if extent.offset else 0
    if not extent.length:
        if offset >= size:
            return f"has offset {offset}, past the end of {file} ({size} bytes)"
        if extent.needs is not None and size - offset < extent.needs:
            return (
                f"is truncated: the tensor needs {extent.needs} bytes from offset {offset} "
                f"but {file} has {size - offset} after it ({size} bytes)"
            )
        return None
    length = int(extent.length)
    if extent.needs is not None and length != extent.needs:
        return f"has length {length}, but the tensor's dims and type need {extent.needs} bytes"
    if offset + length > size:
        return (
            f"is truncated: the tensor needs bytes up to {offset + length} (offset {offset}, length {length}) "
            f"but {file} has {size}"
        )
    return None


# ---------------------------------------------------------------------------------------------
# Graph facts
# ---------------------------------------------------------------------------------------------


def domain_name(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def op_key(node: NodeProto) -> str:
    """`Conv`, or `com.microsoft:QLinearConv` for an op of another domain."""
    domain = domain_name(node.domain)
    return f"{domain}:{node.op_type}" if domain else node.op_type


def op_histogram(model: ModelProto) -> dict[str, int]:
    """Op counts of the main graph alone (an `If` counts once; its branches do not)."""
    return _count_ops(model.graph.node)


def subgraph_op_histogram(model: ModelProto) -> dict[str, int]:
    """Op counts of every subgraph nested in the main graph (If/Loop/Scan bodies, at any depth)."""
    nested = [sub for node in model.graph.node for sub in subgraphs(node)]
    return _count_ops(node for graph in walk(nested) for node in graph.node)


def _count_ops(nodes: Iterable[NodeProto]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in nodes:
        key = op_key(node)
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.STRING:
        return "string"
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, ValueError, TypeError):
        try:
            return str(TensorProto.DataType.Name(elem_type)).lower()
        except ValueError:
            return f"unknown({elem_type})"


def type_name(tp: TypeProto) -> str:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return dtype_name(tp.tensor_type.elem_type)
    if kind == "sparse_tensor_type":
        return f"sparse({dtype_name(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"sequence({type_name(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({type_name(tp.optional_type.elem_type)})"
    if kind == "map_type":
        key = dtype_name(tp.map_type.key_type)
        return f"map({key},{type_name(tp.map_type.value_type)})"
    if kind == "opaque_type":
        return f"opaque({tp.opaque_type.domain}:{tp.opaque_type.name})"
    return UNKNOWN_DIM


def tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    tp = value.type
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        tensor_type: TypeProto.Tensor | TypeProto.SparseTensor = tp.tensor_type
    elif kind == "sparse_tensor_type":
        tensor_type = tp.sparse_tensor_type
    else:
        return TensorInfo(value.name, type_name(tp), ())
    if not tensor_type.HasField("shape"):
        return TensorInfo(value.name, type_name(tp), ())
    dims: list[int | str] = []
    for dim in tensor_type.shape.dim:
        which = dim.WhichOneof("value")
        if which == "dim_value" and dim.dim_value >= 0:
            dims.append(int(dim.dim_value))
        elif which == "dim_param" and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(UNKNOWN_DIM)
    return TensorInfo(value.name, type_name(tp), tuple(dims))


def tensor_size(tensor: TensorProto) -> tuple[int, int]:
    """(elements, bytes) from dims and data type alone; never touches the data."""
    count = math.prod(int(d) for d in tensor.dims)
    elem = tensor.data_type
    if elem in _SUB_BYTE_BITS:
        return count, (count * _SUB_BYTE_BITS[elem] + 7) // 8
    if elem == TensorProto.STRING:
        return count, sum(len(s) for s in tensor.string_data)
    try:
        itemsize = int(onnx.helper.tensor_dtype_to_np_dtype(elem).itemsize)
    except (KeyError, ValueError, TypeError):
        itemsize = 0
    return count, count * itemsize


# Element types a Constant node's tensor counts as a weight for: floats and the low-bit integer
# types quantized weights use. INT32/INT64/BOOL Constants are shapes, axes and indices.
WEIGHT_TYPES = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.FLOAT16,
        TensorProto.BFLOAT16,
        TensorProto.DOUBLE,
        TensorProto.FLOAT8E4M3FN,
        TensorProto.FLOAT8E4M3FNUZ,
        TensorProto.FLOAT8E5M2,
        TensorProto.FLOAT8E5M2FNUZ,
        TensorProto.INT8,
        TensorProto.UINT8,
        TensorProto.INT4,
        TensorProto.UINT4,
        TensorProto.FLOAT4E2M1,
    }
)


def parameters(model: ModelProto) -> tuple[int, int]:
    """Elements and bytes of the weights: every initializer (subgraphs included; sparse ones as
    stored) and the `value` of every Constant node whose type is a weight type (`WEIGHT_TYPES`;
    `value_float(s)` count as float32). Exporters that keep weights in Constant nodes (tf2onnx,
    some TorchScript graphs) would otherwise report 0 parameters."""
    count = nbytes = 0
    for graph in iter_graphs(model):
        for tensor in graph.initializer:
            c, b = tensor_size(tensor)
            count, nbytes = count + c, nbytes + b
        for sparse in graph.sparse_initializer:
            c, b = tensor_size(sparse.values)
            _, ib = tensor_size(sparse.indices)
            count, nbytes = count + c, nbytes + b + ib
        for node in graph.node:
            if node.op_type == "Constant" and domain_name(node.domain) == "":
                c, b = constant_size(node)
                count, nbytes = count + c, nbytes + b
    return count, nbytes


def constant_size(node: NodeProto) -> tuple[int, int]:
    """(elements, bytes) a Constant node holds as weights (0, 0 for shape/index constants)."""
    for attr in node.attribute:
        if attr.name == "value" and attr.t.data_type in WEIGHT_TYPES:
            return tensor_size(attr.t)
        if attr.name == "sparse_value" and attr.sparse_tensor.values.data_type in WEIGHT_TYPES:
            c, b = tensor_size(attr.sparse_tensor.values)
            return c, b + tensor_size(attr.sparse_tensor.indices)[1]
        if attr.name == "value_float":
            return 1, 4
        if attr.name == "value_floats":
            return len(attr.floats), 4 * len(attr.floats)
    return 0, 0
