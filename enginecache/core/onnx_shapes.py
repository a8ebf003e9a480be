"""The output shapes a model's graph computes, whatever its outputs declare.

A published model's declared output shape can be wrong: a static `[1, 10]` where the graph makes
`[batch, 32]`, a fixed batch of 1 where the batch follows the input. ONNX Runtime keeps a declared
shape that it can merge with its own inference (`[1, 32]` stays `[1, 32]` while it returns
`[3, 32]`), so its session metadata repeats the mistake. Here the declared output shapes are
cleared and ONNX's shape inference (with data propagation, for Reshape targets computed from
Shape) runs on the graph alone. Weights are not loaded (external data stays on disk).
"""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

logger = logging.getLogger(__name__)

Shape = tuple[int | str, ...]


def infer_output_shapes(path: Path) -> dict[str, Shape]:
    """Each output's shape as the graph computes it from the inputs' shapes: ints for static dims,
    the symbol for a dim that follows an input's named dim, "?" where inference leaves it unknown.
    An output whose rank inference cannot tell is left out; so is every output when the model does
    not go through shape inference (logged)."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (OSError, DecodeError) as err:
        logger.info("shape inference skipped for %s: %s", path, err)
        return {}
    for output in model.graph.output:
        if output.type.HasField("tensor_type"):
            output.type.tensor_type.ClearField("shape")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError, ValueError) as err:
        logger.info("shape inference failed on %s: %s", path, err)
        return {}
    shapes: dict[str, Shape] = {}
    for output in inferred.graph.output:
        tensor = output.type.tensor_type
        if not output.type.HasField("tensor_type") or not tensor.HasField("shape"):
            continue
        shapes[output.name] = tuple(
            int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim
        )
    return shapes
