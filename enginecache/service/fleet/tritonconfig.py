"""Triton's config.pbtxt for an exported model: rendered from an engine's IO and profile, then checked.

What Triton needs per backend is the backend's own answer (`Backend.triton`): TensorRT engines get
`platform: "tensorrt_plan"` with `cc_model_filenames` mapping each compute capability to the plan
built for it, and `default_model_filename` naming a plan (the exporter names the one for the lowest
compute capability, by number: `cc_number`, sm80 before sm120); ONNX Runtime engines get the
`onnxruntime` backend with the ORT-format model. Inputs and outputs and their types come from the
engine (or the IO `service.fleet.exports.triton_io` gives); `max_batch_size` from the profile (a leading
dynamic dim whose profile starts at 1 is Triton's batch dim). A tensor with no dims left (a scalar,
or `[batch]` once Triton owns the batch dim) is `dims: [ 1 ]` with `reshape: { shape: [ ] }`. A
backend's `TritonInfo.warning` (TensorRT-RTX: stock Triton cannot load its plans) is a comment at
the top. An engine bundle (TensorRT-LLM's engine folder) is served by Triton's `tensorrtllm` backend,
whose config names the folder (`gpt_model_path`) instead of a model file: `render_trtllm_config`.
`validate_triton_config` parses the text with Triton's own schema
(`tritonclient.grpc.model_config_pb2.ModelConfig`, dev extra) when it is installed, and always
checks it field by field.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from enginecache.core.backends.registry import get_backend
from enginecache.db.models import EngineRecord
from enginecache.errors import ExportError

logger = logging.getLogger("enginecache.service.fleet.exports")  # the export's log: its lines keep their logger name

TRITON_TYPES = {
    "float32": "TYPE_FP32",
    "float16": "TYPE_FP16",
    "bfloat16": "TYPE_BF16",
    "float64": "TYPE_FP64",
    "int64": "TYPE_INT64",
    "int32": "TYPE_INT32",
    "int16": "TYPE_INT16",
    "int8": "TYPE_INT8",
    "uint8": "TYPE_UINT8",
    "bool": "TYPE_BOOL",
}


def _dynamic(dim: Any) -> bool:
    return not isinstance(dim, int) or dim < 0


def triton_batching(engine: EngineRecord, io: list[dict[str, Any]] | None = None) -> int:
    """Triton's max_batch_size: the profile's max batch when every tensor's leading dim is dynamic
    and every input's profile starts at batch 1; 0 (no implicit batch dim) otherwise. `io` defaults
    to the engine's recorded IO."""
    profiles = engine.build_options.get("profiles", {})
    io = engine.io if io is None else io
    if not io or any(not t["shape"] or not _dynamic(t["shape"][0]) for t in io):
        return 0
    inputs = [t for t in io if t["mode"] == "input"]
    if any(t["name"] not in profiles or profiles[t["name"]]["min"][0] != 1 for t in inputs):
        return 0
    return min(int(profiles[t["name"]]["max"][0]) for t in inputs)


def _tensor_block(tensor: dict[str, Any], batched: bool) -> str:
    dtype = TRITON_TYPES.get(str(tensor["dtype"]))
    if dtype is None:
        raise ExportError(f"tensor {tensor['name']}: type {tensor['dtype']} has no Triton data type")
    shape = list(tensor["shape"])[1:] if batched else list(tensor["shape"])
    dims = [(-1 if _dynamic(d) else int(d)) for d in shape]
    lines = ["  {", f"    name: {json.dumps(tensor['name'])}", f"    data_type: {dtype}"]
    if dims:
        lines.append(f"    dims: [ {', '.join(str(d) for d in dims)} ]")
    else:  # a scalar (or [batch] once Triton owns the batch dim): Triton's dims cannot be empty
        lines += ["    dims: [ 1 ]", "    reshape: { shape: [ ] }"]
    return "\n".join([*lines, "  }"])


def cc_number(key: str) -> tuple[int, ...]:
    """A `cc_model_filenames` key ('8.6', '12.0') as numbers, so 8.0 sorts before 12.0."""
    return tuple(int(part) for part in key.split("."))


def render_triton_config(
    name: str,
    engine: EngineRecord,
    *,
    default_file: str,
    cc_files: dict[str, str] | None = None,
    io: list[dict[str, Any]] | None = None,
) -> str:
    """config.pbtxt text for one model built from `engine`'s IO (or `io`, see `triton_io`) and
    profile; the backend's Triton warning, if it has one, as a comment on top."""
    io = engine.io if io is None else io
    max_batch = triton_batching(engine, io)
    batched = max_batch > 0
    triton = get_backend(engine.backend).triton
    lines = [f"# WARNING: {triton.warning}"] if triton.warning else []
    lines += [f"name: {json.dumps(name)}", f"platform: {json.dumps(triton.platform)}"]
    if triton.backend is not None:
        lines.append(f"backend: {json.dumps(triton.backend)}")
    lines.append(f"max_batch_size: {max_batch}")
    lines.append("version_policy: { latest: { num_versions: 1 } }")
    lines.append(f"default_model_filename: {json.dumps(default_file)}")
    for cc, filename in sorted((cc_files or {}).items(), key=lambda item: cc_number(item[0])):
        lines.append(f"cc_model_filenames: {{ key: {json.dumps(cc)} value: {json.dumps(filename)} }}")
    inputs = [t for t in io if t["mode"] == "input"]
    outputs = [t for t in io if t["mode"] == "output"]
    lines.append("input [\n" + ",\n".join(_tensor_block(t, batched) for t in inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(_tensor_block(t, batched) for t in outputs) + "\n]")
    lines.append(f"instance_group [ {{ count: 1 kind: {triton.instance_kind} }} ]")
    return "\n".join(lines) + "\n"


# The request and response tensors of Triton's `tensorrtllm` backend (its inflight-batcher model's
# config): the ones every request carries, and the sampling controls most clients send.
_TRTLLM_INPUTS = (
    ("input_ids", "TYPE_INT32", "[ -1 ]", ("allow_ragged_batch: true",)),
    ("input_lengths", "TYPE_INT32", "[ 1 ]", ("reshape: { shape: [ ] }",)),
    ("request_output_len", "TYPE_INT32", "[ 1 ]", ()),
    ("end_id", "TYPE_INT32", "[ 1 ]", ("reshape: { shape: [ ] }", "optional: true")),
    ("pad_id", "TYPE_INT32", "[ 1 ]", ("reshape: { shape: [ ] }", "optional: true")),
    ("beam_width", "TYPE_INT32", "[ 1 ]", ("reshape: { shape: [ ] }", "optional: true")),
    ("temperature", "TYPE_FP32", "[ 1 ]", ("reshape: { shape: [ ] }", "optional: true")),
    ("runtime_top_k", "TYPE_INT32", "[ 1 ]", ("reshape: { shape: [ ] }", "optional: true")),
    ("runtime_top_p", "TYPE_FP32", "[ 1 ]", ("reshape: { shape: [ ] }", "optional: true")),
    ("streaming", "TYPE_BOOL", "[ 1 ]", ("optional: true",)),
)
_TRTLLM_OUTPUTS = (("output_ids", "TYPE_INT32", "[ -1, -1 ]"), ("sequence_length", "TYPE_INT32", "[ -1 ]"))


def trtllm_max_batch(config: dict[str, Any], label: str) -> int:
    """Triton's max_batch_size for a TensorRT-LLM engine folder: its config.json's
    `build_config.max_batch_size` (what trtllm-build was given). ExportError when it is absent: the
    backend batches in flight and needs it, and a guess would refuse requests the engine can take."""
    build = config.get("build_config")
    value = build.get("max_batch_size") if isinstance(build, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExportError(
            f"{label}: config.json has no build_config.max_batch_size (a positive integer), which Triton's "
            "tensorrtllm backend needs; export --format tree writes the folder without a Triton config"
        )
    return value


def _fixed_block(name: str, dtype: str, dims: str, extra: tuple[str, ...]) -> str:
    lines = ["  {", f"    name: {json.dumps(name)}", f"    data_type: {dtype}", f"    dims: {dims}"]
    return "\n".join([*lines, *(f"    {line}" for line in extra), "  }"])


def render_trtllm_config(name: str, *, engine_dir: Path, max_batch: int, warning: str | None) -> str:
    """config.pbtxt for Triton's `tensorrtllm` backend serving the engine folder `engine_dir` (an
    absolute path: the backend reads `gpt_model_path` as given, so the repository is served from where
    it was written, or the path is edited), in-flight batching, `max_batch` requests at once."""
    lines = [f"# WARNING: {warning}"] if warning else []
    lines += [
        f"name: {json.dumps(name)}",
        'backend: "tensorrtllm"',
        f"max_batch_size: {max_batch}",
        "model_transaction_policy { decoupled: false }",
        f"dynamic_batching {{ preferred_batch_size: [ {max_batch} ] }}",
    ]
    inputs = [_fixed_block(tensor, dtype, dims, extra) for tensor, dtype, dims, extra in _TRTLLM_INPUTS]
    outputs = [_fixed_block(tensor, dtype, dims, ()) for tensor, dtype, dims in _TRTLLM_OUTPUTS]
    lines.append("input [\n" + ",\n".join(inputs) + "\n]")
    lines.append("output [\n" + ",\n".join(outputs) + "\n]")
    lines.append("instance_group [ { count: 1 kind: KIND_CPU } ]")  # the backend places ranks on GPUs itself
    for key, value in (("gpt_model_type", "inflight_fused_batching"), ("gpt_model_path", str(engine_dir))):
        lines.append(f"parameters: {{ key: {json.dumps(key)} value: {{ string_value: {json.dumps(value)} }} }}")
    return "\n".join(lines) + "\n"


def validate_triton_config(text: str, version_dir: Path) -> dict[str, Any]:
    """Parse with Triton's schema when tritonclient is installed (unknown or mistyped fields raise),
    and check what a schema cannot: the files named exist, dims are set, batching is consistent."""
    from google.protobuf import json_format, text_format

    try:
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        model_config_pb2 = None
    if model_config_pb2 is not None:
        try:
            config = text_format.Parse(text, model_config_pb2.ModelConfig())
        except text_format.ParseError as err:
            raise ExportError(f"generated config.pbtxt does not parse against Triton's schema: {err}") from err
        parsed: dict[str, Any] = json_format.MessageToDict(config, preserving_proto_field_name=True)
    else:
        logger.info("tritonclient is not installed: config.pbtxt checked by field only")
        parsed = {}
    names = re.findall(r'\b(?:default_model_filename|value): "([^"]+)"', text)
    missing = [n for n in names if not (version_dir / n).is_file()]
    if missing:
        raise ExportError(f"config.pbtxt names file(s) {', '.join(missing)} missing from {version_dir}")
    if re.search(r"dims: \[\s*\]", text):
        raise ExportError("config.pbtxt has a tensor without dims")
    return parsed
