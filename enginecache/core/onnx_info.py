"""Inspect an ONNX model without loading its weights, and hash it.

`inspect_model` reads the model proto with ``load_external_data=False``: inputs and outputs
with their dynamic dims, opsets, IR version, producer, an op histogram (subgraphs included),
parameter count and bytes (computed from initializer dims, never from the weights), and the
external data files the model refers to. Every external data reference is validated before
anything else touches it: it must be a relative path without ``..``, must not be or pass
through a symlink inside the model's folder, must stay inside that folder, and must exist.
The model also goes through ``onnx.checker.check_model`` on its path (which checks external
data references but does not read their bytes, so it stays cheap for models over 2 GB).

Digest (`model_digest`):

* no external data: the sha256 of the model file's bytes, i.e. exactly what
  ``sha256sum model.onnx`` prints;
* with external data: the sha256 of the UTF-8 text ``"onnx-bundle-v1\\n"`` followed by one
  line ``f"{relpath}\\t{size}\\t{sha256}\\n"`` for the model file (its relpath is its file
  name), then one such line for each external data file, sorted by relative posix path
  (as written in the model, normalised: ``./w.data`` is ``w.data``).

The bundle digest therefore does not depend on the folder the model lives in, and changes
when any byte of the model or of an external file changes. Each file is read once, streaming.
"""

from __future__ import annotations

import hashlib
import math
import stat
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
from google.protobuf.message import DecodeError
from onnx import (
    AttributeProto,
    GraphProto,
    ModelProto,
    NodeProto,
    TensorProto,
    TypeProto,
)

from enginecache.core.hashing import hash_file
from enginecache.errors import ExternalDataError, InvalidModelError

__all__ = [
    "BUNDLE_HEADER",
    "ModelInfo",
    "TensorInfo",
    "inspect_model",
    "model_digest",
    "resolve_external_data",
]

BUNDLE_HEADER = "onnx-bundle-v1\n"
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

# Top-level ModelProto fields and their wire types, to tell "truncated" from "not ONNX".
_VARINT, _LEN = 0, 2
_MODEL_FIELDS: dict[int, int] = {
    1: _VARINT,  # ir_version
    2: _LEN,  # producer_name
    3: _LEN,  # producer_version
    4: _LEN,  # domain
    5: _VARINT,  # model_version
    6: _LEN,  # doc_string
    7: _LEN,  # graph
    8: _LEN,  # opset_import
    14: _LEN,  # metadata_props
    20: _LEN,  # training_info
    25: _LEN,  # functions
    26: _LEN,  # configuration
}


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
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "dynamic": self.is_dynamic,
        }


@dataclass(frozen=True)
class ModelInfo:
    """What `inspect_model` learnt about one model file (and its external data)."""

    path: Path
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    ir_version: int
    opsets: dict[str, int]
    producer_name: str
    producer_version: str
    graph_name: str
    op_histogram: dict[str, int]
    parameter_count: int
    parameter_bytes: int
    external_data_files: tuple[str, ...]
    size_bytes: int
    digest: str

    def to_dict(self) -> dict[str, object]:
        """A JSON-safe dict (paths as strings, tuples as lists)."""
        return {
            "path": str(self.path),
            "inputs": [t.to_dict() for t in self.inputs],
            "outputs": [t.to_dict() for t in self.outputs],
            "ir_version": self.ir_version,
            "opsets": dict(self.opsets),
            "producer_name": self.producer_name,
            "producer_version": self.producer_version,
            "graph_name": self.graph_name,
            "op_histogram": dict(self.op_histogram),
            "parameter_count": self.parameter_count,
            "parameter_bytes": self.parameter_bytes,
            "external_data_files": list(self.external_data_files),
            "size_bytes": self.size_bytes,
            "digest": self.digest,
        }


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------


def inspect_model(path: Path) -> ModelInfo:
    """Inspect `path` without loading weights; validate it; hash it (see the module docstring).

    Raises `InvalidModelError` for a missing, empty, non-ONNX, truncated or checker-rejected
    file and `ExternalDataError` for an unsafe or missing external data reference.
    """
    path = Path(path)
    model_size = _check_file(path)
    model = _load_proto(path)

    refs = list(_external_refs(model))
    # Validate every reference before the checker or the hasher opens anything.
    files = dict(zip((_normalise(loc) for _, loc, _ in refs), _resolve(path, refs), strict=True))
    locations = sorted(files)

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as err:
        raise InvalidModelError(f"{path}: onnx.checker rejected the model: {err}") from err

    graph = model.graph
    initializer_names = {t.name for t in graph.initializer}
    initializer_names.update(s.values.name for s in graph.sparse_initializer)
    inputs = tuple(_tensor_info(v) for v in graph.input if v.name not in initializer_names)
    outputs = tuple(_tensor_info(v) for v in graph.output)

    count, nbytes = _parameters(model)
    size = model_size + sum(file.stat().st_size for file in files.values())

    return ModelInfo(
        path=path,
        inputs=inputs,
        outputs=outputs,
        ir_version=int(model.ir_version),
        opsets={_domain(o.domain): int(o.version) for o in model.opset_import},
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        graph_name=graph.name,
        op_histogram=_op_histogram(model),
        parameter_count=count,
        parameter_bytes=nbytes,
        external_data_files=tuple(locations),
        size_bytes=size,
        digest=model_digest(path, locations),
    )


def model_digest(path: Path, external_data_files: Sequence[str]) -> str:
    """The model's identity: sha256 of the file, or of the bundle listing (module docstring)."""
    path = Path(path)
    if not external_data_files:
        return hash_file(path).sha256
    resolved = resolve_external_data(path, external_data_files)
    entries = sorted(zip((_normalise(loc) for loc in external_data_files), resolved, strict=True))
    bundle = hashlib.sha256(BUNDLE_HEADER.encode("utf-8"))
    model = hash_file(path)
    bundle.update(f"{path.name}\t{model.size}\t{model.sha256}\n".encode())
    seen: set[str] = set()
    for relpath, file in entries:
        if relpath in seen:
            continue
        seen.add(relpath)
        digest = hash_file(file)
        bundle.update(f"{relpath}\t{digest.size}\t{digest.sha256}\n".encode())
    return bundle.hexdigest()


def resolve_external_data(model_path: Path, locations: Iterable[str]) -> list[Path]:
    """Validate external data `locations` (as written in the model) and return absolute paths.

    One path per location, in the given order. Raises `ExternalDataError` for an absolute
    location, one with a ``..`` part, one that is or passes through a symlink inside the
    model's folder, one that resolves outside that folder, or one whose file is missing.
    """
    return _resolve(Path(model_path), [("", loc, None) for loc in locations])


# ---------------------------------------------------------------------------------------------
# File and proto checks
# ---------------------------------------------------------------------------------------------


def _check_file(path: Path) -> int:
    try:
        st = path.stat()
    except FileNotFoundError as err:
        raise InvalidModelError(f"{path} is not a file: it does not exist") from err
    except OSError as err:
        raise InvalidModelError(f"{path} is not a file: {err.strerror}") from err
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise InvalidModelError(f"{path} is not a file: it is {kind}")
    if st.st_size == 0:
        raise InvalidModelError(f"{path} is empty (0 bytes)")
    return st.st_size


def _load_proto(path: Path) -> ModelProto:
    try:
        model = onnx.load(str(path), format="protobuf", load_external_data=False)
    except DecodeError as err:
        raise InvalidModelError(_diagnose_parse_failure(path, err)) from err
    missing = []
    if model.ir_version <= 0:
        missing.append("no ir_version")
    if not model.HasField("graph"):
        missing.append("no graph")
    if not model.opset_import:
        missing.append("no opset_import")
    if missing:
        raise InvalidModelError(
            f"{path} is not an ONNX model (or is truncated): the bytes parse as protobuf but have {', '.join(missing)}"
        )
    return model


def _diagnose_parse_failure(path: Path, err: DecodeError) -> str:
    """Walk the top-level protobuf fields to say "truncated" or "not ONNX" rather than guess.

    Serialisers write fields in number order, so a real model starts with ir_version
    (field 1, a small varint); anything else is not ONNX. After that, a length-delimited
    field running past the end of the file means the file was cut short.
    """
    data = path.read_bytes()
    n = len(data)
    not_onnx = (
        f"{path} is not an ONNX model: it does not parse as an ONNX ModelProto "
        f"(first bytes {data[:8]!r}; protobuf says: {err})"
    )
    key, pos = _varint(data, 0)
    ir_version, pos = _varint(data, pos)
    if key != (1 << 3 | _VARINT) or ir_version is None or not 1 <= ir_version <= 1000:
        return not_onnx
    while pos < n:
        key, pos = _varint(data, pos)
        if key is None:
            break
        number, wire = key >> 3, key & 7
        if _MODEL_FIELDS.get(number) != wire:
            break
        value, pos = _varint(data, pos)
        if value is None:
            return f"{path} is truncated or corrupt: it ends inside top-level field {number}"
        if wire == _LEN:
            if pos + value > n:
                return (
                    f"{path} is truncated or corrupt: top-level field {number} declares "
                    f"{value} bytes but only {n - pos} remain in the {n}-byte file"
                )
            pos += value
    return f"{path} is a truncated or corrupt ONNX model (protobuf says: {err})"


def _varint(data: bytes, pos: int) -> tuple[int | None, int]:
    result = 0
    shift = 0
    while pos < len(data) and shift < 64:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
    return None, pos


# ---------------------------------------------------------------------------------------------
# Graph walking and external data
# ---------------------------------------------------------------------------------------------


def _walk(roots: Iterable[GraphProto]) -> Iterator[GraphProto]:
    """`roots` and every subgraph nested in their nodes (If/Loop/Scan bodies), iteratively."""
    stack = list(roots)
    while stack:
        graph = stack.pop()
        yield graph
        for node in graph.node:
            stack.extend(_subgraphs(node))


def _iter_graphs(model: ModelProto) -> Iterator[GraphProto]:
    """The main graph and all its subgraphs."""
    return _walk([model.graph])


def _subgraphs(node: NodeProto) -> Iterator[GraphProto]:
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == AttributeProto.GRAPHS:
            yield from attr.graphs


def _all_nodes(model: ModelProto) -> Iterator[NodeProto]:
    """Nodes of the main graph, of model-local functions, and of all their subgraphs."""
    for graph in _all_graphs(model):
        yield from graph.node
    for function in model.functions:
        yield from function.node


def _all_graphs(model: ModelProto) -> Iterator[GraphProto]:
    """The main graph, subgraphs of model-local functions, and everything nested in them."""
    function_graphs = [sub for f in model.functions for n in f.node for sub in _subgraphs(n)]
    return _walk([model.graph, *function_graphs])


def _all_tensors(model: ModelProto) -> Iterator[TensorProto]:
    """Every TensorProto that may carry data: initializers and tensor attributes."""
    for graph in _all_graphs(model):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
    for node in _all_nodes(model):
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


def _external_refs(model: ModelProto) -> Iterator[tuple[str, str, int | None]]:
    """(tensor name, location, offset + length or None) for each externally stored tensor."""
    for tensor in _all_tensors(model):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {entry.key: entry.value for entry in tensor.external_data}
        location = info.get("location", "")
        end: int | None = None
        if "length" in info:
            try:
                end = int(info.get("offset", "0") or "0") + int(info["length"])
            except ValueError as err:
                raise ExternalDataError(
                    f"tensor {tensor.name!r}: external data offset/length are not integers "
                    f"({info.get('offset')!r}, {info.get('length')!r})"
                ) from err
        yield tensor.name, location, end


def _normalise(location: str) -> str:
    return PurePosixPath(location).as_posix()


def _resolve(model_path: Path, refs: Sequence[tuple[str, str, int | None]]) -> list[Path]:
    folder = model_path.absolute().parent
    real_folder = folder.resolve()
    out: list[Path] = []
    for tensor, location, end in refs:

        def fail(problem: str, tensor: str = tensor, location: str = location) -> ExternalDataError:
            who = f"tensor {tensor!r} external data" if tensor else "external data"
            return ExternalDataError(f"{model_path}: {who} location {location!r} {problem}")

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
        if end is not None and end > candidate.stat().st_size:
            raise fail(
                f"is truncated: the tensor needs bytes up to {end} but {candidate.name} has {candidate.stat().st_size}"
            )
        out.append(candidate)
    return out


# ---------------------------------------------------------------------------------------------
# Graph facts
# ---------------------------------------------------------------------------------------------


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def _op_histogram(model: ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}
    for graph in _iter_graphs(model):
        for node in graph.node:
            domain = _domain(node.domain)
            key = f"{domain}:{node.op_type}" if domain else node.op_type
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _dtype_name(elem_type: int) -> str:
    if elem_type == TensorProto.STRING:
        return "string"
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, ValueError, TypeError):
        try:
            return str(TensorProto.DataType.Name(elem_type)).lower()
        except ValueError:
            return f"unknown({elem_type})"


def _type_name(tp: TypeProto) -> str:
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        return _dtype_name(tp.tensor_type.elem_type)
    if kind == "sparse_tensor_type":
        return f"sparse({_dtype_name(tp.sparse_tensor_type.elem_type)})"
    if kind == "sequence_type":
        return f"sequence({_type_name(tp.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_name(tp.optional_type.elem_type)})"
    if kind == "map_type":
        key = _dtype_name(tp.map_type.key_type)
        return f"map({key},{_type_name(tp.map_type.value_type)})"
    if kind == "opaque_type":
        return f"opaque({tp.opaque_type.domain}:{tp.opaque_type.name})"
    return UNKNOWN_DIM


def _tensor_info(value: onnx.ValueInfoProto) -> TensorInfo:
    tp = value.type
    kind = tp.WhichOneof("value")
    if kind == "tensor_type":
        tensor_type: TypeProto.Tensor | TypeProto.SparseTensor = tp.tensor_type
    elif kind == "sparse_tensor_type":
        tensor_type = tp.sparse_tensor_type
    else:
        return TensorInfo(value.name, _type_name(tp), ())
    if not tensor_type.HasField("shape"):
        return TensorInfo(value.name, _type_name(tp), ())
    dims: list[int | str] = []
    for dim in tensor_type.shape.dim:
        which = dim.WhichOneof("value")
        if which == "dim_value" and dim.dim_value >= 0:
            dims.append(int(dim.dim_value))
        elif which == "dim_param" and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(UNKNOWN_DIM)
    return TensorInfo(value.name, _type_name(tp), tuple(dims))


def _tensor_size(tensor: TensorProto) -> tuple[int, int]:
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


def _parameters(model: ModelProto) -> tuple[int, int]:
    """Elements and bytes of all initializers (subgraphs included; sparse ones as stored)."""
    count = nbytes = 0
    for graph in _iter_graphs(model):
        for tensor in graph.initializer:
            c, b = _tensor_size(tensor)
            count, nbytes = count + c, nbytes + b
        for sparse in graph.sparse_initializer:
            c, b = _tensor_size(sparse.values)
            _, ib = _tensor_size(sparse.indices)
            count, nbytes = count + c, nbytes + b + ib
    return count, nbytes
