"""Inspect an ONNX model without loading its weights, and hash it.

`inspect_model` reads the model proto with ``load_external_data=False``: inputs and outputs
with their dynamic dims, opsets, IR version, producer, op histograms (the main graph's, and apart
from it the ops inside If/Loop/Scan bodies), parameter count and bytes (computed from the dims of
initializers and of Constant-node weights, never from the weights themselves), whether and how the
model is already quantized, how many initializers it also lists as graph inputs (not counted among
its inputs), and the external data files the model refers to. Every external
data reference is validated before anything else touches it: it must be a relative path
without ``..``, must not be or pass through a symlink inside the model's folder, must stay
inside that folder, and must exist; its ``offset`` and ``length`` must be non-negative decimal
integers that fit the file (offset + length <= its size; an offset alone < its size), and the
length must be what the tensor's dims and type need (so a converter or a backend never reads
bytes the file does not have: `check_external_data` runs the same checks on a stored model).
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
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError
from onnx import (
    ModelProto,
)

from enginecache.core.hashing import DigestResult, hash_file
from enginecache.core.onnx_graph import (
    TensorInfo,
    domain_name,
    external_refs,
    normalise_location,
    op_histogram,
    parameters,
    resolve_refs,
    subgraph_op_histogram,
    tensor_info,
)
from enginecache.core.onnx_initinputs import initializer_inputs
from enginecache.core.onnx_quantized import quantization
from enginecache.errors import InvalidModelError

__all__ = [
    "BUNDLE_HEADER",
    "ModelInfo",
    "TensorInfo",
    "check_external_data",
    "inspect_model",
    "model_digest",
    "resolve_external_data",
]

BUNDLE_HEADER = "onnx-bundle-v1\n"

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
    """Ops of the main graph; those nested in If/Loop/Scan bodies are in `subgraph_op_histogram`."""
    subgraph_op_histogram: dict[str, int]
    parameter_count: int
    parameter_bytes: int
    external_data_files: tuple[str, ...]
    size_bytes: int
    digest: str
    chunk_blake3: dict[str, str] = field(default_factory=dict)
    """Each file's chunk digests (`core.chunkdigests`' encoding) by its name in the bundle, for the
    files over one chunk: a verify that finds the bundle changed names the file and the chunk."""
    quantized: str | None = None
    """How the model is already quantized (Q/DQ nodes, QOperator ops, integer ops, INT8 weights
    dequantized by Cast/Mul), or None for a float model: such a model builds only as is (fp32)."""
    initializer_inputs: int = 0
    """Initializers the model also lists among its graph inputs (`core.onnx_initinputs`: IR < 4 needed
    them, old exporters kept them): not in `inputs`; a precision conversion takes them out first."""

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
            "subgraph_op_histogram": dict(self.subgraph_op_histogram),
            "parameter_count": self.parameter_count,
            "parameter_bytes": self.parameter_bytes,
            "external_data_files": list(self.external_data_files),
            "size_bytes": self.size_bytes,
            "digest": self.digest,
            "chunk_blake3": dict(self.chunk_blake3),
            "quantized": self.quantized,
            "initializer_inputs": self.initializer_inputs,
        }


# ---------------------------------------------------------------------------------------------
# Public functions
# ---------------------------------------------------------------------------------------------


def inspect_model(path: Path) -> ModelInfo:
    """Inspect `path` without loading weights; validate it; hash it (see the module docstring).

    Raises `InvalidModelError` for a missing, empty, non-ONNX, truncated or checker-rejected
    file (a string field that is not UTF-8 included: ONNX's proto2 strings are not checked when
    parsed) and `ExternalDataError` for an unsafe or missing external data reference.
    """
    path = Path(path)
    try:
        info = _inspect(path)
    except UnicodeDecodeError as err:  # found by tests/test_fuzz_model_add.py
        raise InvalidModelError(
            f"{path}: a name or string in the model is not valid UTF-8 ({err.reason} at byte {err.start})"
        ) from err
    undecodable = next(_bytes_fields(info.to_dict(), "model"), None)  # protobuf hands such strings back as bytes
    if undecodable is not None:
        raise InvalidModelError(f"{path}: {undecodable} is not valid UTF-8 text")
    return info


def _bytes_fields(value: object, where: str) -> Iterator[str]:
    """Where in an inspection's dict a string field came back as bytes (not valid UTF-8)."""
    if isinstance(value, bytes):
        yield where
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _bytes_fields(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _bytes_fields(item, f"{where}[{index}]")


def _inspect(path: Path) -> ModelInfo:
    model_size = _check_file(path)
    model = _load_proto(path)

    refs = list(external_refs(model))
    # Validate every reference before the checker or the hasher opens anything.
    files = dict(zip((normalise_location(loc) for _, loc, _ in refs), resolve_refs(path, refs), strict=True))
    locations = sorted(files)

    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as err:
        raise InvalidModelError(f"{path}: onnx.checker rejected the model: {err}") from err

    graph = model.graph
    initializer_names = set(initializer_inputs(graph))
    inputs = tuple(tensor_info(v) for v in graph.input if v.name not in initializer_names)
    outputs = tuple(tensor_info(v) for v in graph.output)

    count, nbytes = parameters(model)
    size = model_size + sum(file.stat().st_size for file in files.values())
    hashed: dict[str, DigestResult] = {}

    def read(file: Path, relpath: str) -> DigestResult:
        hashed[relpath] = found = hash_file(file)
        return found

    digest = model_digest(path, locations, read=read)

    return ModelInfo(
        path=path,
        inputs=inputs,
        outputs=outputs,
        ir_version=int(model.ir_version),
        opsets={domain_name(o.domain): int(o.version) for o in model.opset_import},
        producer_name=model.producer_name,
        producer_version=model.producer_version,
        graph_name=graph.name,
        op_histogram=op_histogram(model),
        subgraph_op_histogram=subgraph_op_histogram(model),
        parameter_count=count,
        parameter_bytes=nbytes,
        external_data_files=tuple(locations),
        size_bytes=size,
        digest=digest,
        chunk_blake3={name: found.chunk_blake3 for name, found in hashed.items() if found.chunk_blake3},
        quantized=quantization(model),
        initializer_inputs=len(initializer_names),
    )


def check_external_data(path: Path) -> tuple[str, ...]:
    """Run `inspect_model`'s external data checks alone (locations, offsets, lengths) on `path`,
    reading only the model's proto, neither the data nor a digest; returns the files it names.

    Raises `InvalidModelError` for a model file that is not one and `ExternalDataError` for a
    reference that is unsafe, names a missing file, or names bytes the file does not hold."""
    path = Path(path)
    _check_file(path)
    refs = list(external_refs(_load_proto(path)))
    resolve_refs(path, refs)
    return tuple(sorted({normalise_location(loc) for _, loc, _ in refs}))


def _hash_only(path: Path, _relpath: str) -> DigestResult:
    return hash_file(path)


def model_digest(
    path: Path, external_data_files: Sequence[str], *, read: Callable[[Path, str], DigestResult] = _hash_only
) -> str:
    """The model's identity: sha256 of the file, or of the bundle listing (module docstring).

    `read(file, relpath)` hashes each file once (the model file's relpath is its name); by default it
    only hashes, `service.models.verify.stage_bundle` passes one that copies while it hashes."""
    path = Path(path)
    if not external_data_files:
        return read(path, path.name).sha256
    resolved = resolve_external_data(path, external_data_files)
    entries = sorted(zip((normalise_location(loc) for loc in external_data_files), resolved, strict=True))
    bundle = hashlib.sha256(BUNDLE_HEADER.encode("utf-8"))
    model = read(path, path.name)
    bundle.update(f"{path.name}\t{model.size}\t{model.sha256}\n".encode())
    seen: set[str] = set()
    for relpath, file in entries:
        if relpath in seen:
            continue
        seen.add(relpath)
        digest = read(file, relpath)
        bundle.update(f"{relpath}\t{digest.size}\t{digest.sha256}\n".encode())
    return bundle.hexdigest()


def resolve_external_data(model_path: Path, locations: Iterable[str]) -> list[Path]:
    """Validate external data `locations` (as written in the model) and return absolute paths.

    One path per location, in the given order. Raises `ExternalDataError` for an absolute
    location, one with a ``..`` part, one that is or passes through a symlink inside the
    model's folder, one that resolves outside that folder, or one whose file is missing.
    """
    return resolve_refs(Path(model_path), [("", loc, None) for loc in locations])


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
    # Never the bytes themselves: the message may be shown to someone who may not read the file.
    not_onnx = (
        f"{path} is not an ONNX model: it does not parse as an ONNX ModelProto{_looks_like(data)} "
        f"(protobuf says: {err})"
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


# Files often registered by mistake, told apart by their first bytes (which are never echoed).
_LOOKALIKES = (
    (b"version https://git-lfs", "a Git LFS pointer file, not the model it points to (run `git lfs pull`)"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x1f\x8b", "a gzip file"),
)


def _looks_like(data: bytes) -> str:
    for magic, what in _LOOKALIKES:
        if data.startswith(magic):
            return f": it is {what}"
    return ""


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
