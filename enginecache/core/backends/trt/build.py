"""Building a TensorRT or TensorRT-RTX plan from an ONNX file: parse, configure, build, write.

Both libraries share the Builder / OnnxParser / BuilderConfig API. Networks are built strongly
typed where the library has the flag (`STRONGLY_TYPED`: TensorRT 10+, TensorRT-RTX), so the
precision is the ONNX graph's and no FP16/INT8 builder flags are set. TensorRT-RTX also takes the
compute capabilities to build for (`config.set_compute_capability`); TensorRT builds for its GPU.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from enginecache.core.backends.base import BuildOutput, BuildSpec, ProgressCallback, TensorIO
from enginecache.core.backends.trt.dtypes import dtype_name
from enginecache.core.backends.trt.trtlog import progress_monitor
from enginecache.errors import BuildFailedError


def build_plan(
    trt: ModuleType,
    trt_logger: Any,
    spec: BuildSpec,
    output: Path,
    progress: ProgressCallback | None,
    sink: list[str],
    *,
    label: str,
    aot_targets: bool,
) -> BuildOutput:
    """Parse `spec.onnx_path` and build it into `output` with `trt` (TensorRT or TensorRT-RTX,
    `aot_targets` for the latter: it builds for `spec.targets`' compute capabilities), the
    builder logging through `trt_logger` into `sink`; `label` names the library in errors."""
    trt_logger.min_severity = trt.Logger.VERBOSE if hasattr(trt.Logger, "VERBOSE") else None
    builder = trt.Builder(trt_logger)
    flags = 0
    creation = getattr(trt, "NetworkDefinitionCreationFlag", None)
    if creation is not None and hasattr(creation, "STRONGLY_TYPED"):
        flags |= 1 << int(creation.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(spec.onnx_path)):
        errors = [_parser_error(parser.get_error(i)) for i in range(parser.num_errors)]
        raise BuildFailedError(f"{label} could not parse {spec.onnx_path.name}: " + "; ".join(errors or _errors(sink)))
    config = builder.create_builder_config()
    if aot_targets:
        config.num_compute_capabilities = len(spec.targets)
        for index, sm in enumerate(spec.targets):
            config.set_compute_capability(getattr(trt.ComputeCapability, sm.upper()), index)
    if spec.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, spec.workspace_bytes)
    if spec.opt_level is not None:
        config.builder_optimization_level = spec.opt_level
    if progress is not None and hasattr(config, "progress_monitor"):
        config.progress_monitor = progress_monitor(trt, progress)
    profile = builder.create_optimization_profile()
    dynamic = False
    for shapes in spec.profile.inputs:
        tensor = _network_input(network, shapes.name)
        if tensor is None:
            raise BuildFailedError(f"profile names {shapes.name!r}, which the parsed network has no input for")
        if any(d < 0 for d in tensor.shape):
            profile.set_shape(shapes.name, shapes.min, shapes.opt, shapes.max)
            dynamic = True
    if dynamic:
        config.add_optimization_profile(profile)
    io = _network_io(network)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BuildFailedError(f"{label} failed to build {spec.onnx_path.name}: " + "; ".join(_errors(sink)))
    with open(output, "wb") as stream:
        stream.write(memoryview(serialized))
    del serialized
    return BuildOutput(engine_path=output, io=io, log="\n".join(sink))


def _parser_error(error: Any) -> str:
    node_name = error.node_name() if hasattr(error, "node_name") else ""
    operator = error.node_operator() if hasattr(error, "node_operator") else ""
    where = f"node {node_name or error.node()}" + (f" ({operator})" if operator else "")
    return f"{where}: {error.desc()}"


def _network_input(network: Any, name: str) -> Any:
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        if tensor.name == name:
            return tensor
    return None


def _network_io(network: Any) -> tuple[TensorIO, ...]:
    io: list[TensorIO] = []
    for index in range(network.num_inputs):
        tensor = network.get_input(index)
        io.append(TensorIO(tensor.name, "input", dtype_name(tensor.dtype), tuple(tensor.shape)))
    for index in range(network.num_outputs):
        tensor = network.get_output(index)
        io.append(TensorIO(tensor.name, "output", dtype_name(tensor.dtype), tuple(tensor.shape)))
    return tuple(io)


def _errors(sink: list[str]) -> list[str]:
    found = [line for line in sink if line.startswith(("[ERROR]", "[INTERNAL_ERROR]"))]
    return found or ["no error message from the library (see the builder log)"]
