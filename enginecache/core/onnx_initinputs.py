"""Initializers that a model also lists among its graph inputs.

IR versions before 4 required every initializer to be a graph input too, and exporters such as
PyTorch before 1.4 kept writing them so at IR 4: each weight is then also an input with a default
value that a caller could override. Runtimes read such a model, but precision converters do not:
onnxconverter-common casts the initializer and leaves its input declaration at float32 (shape
inference then fails with "Inferred elem type differs"), and ModelOpt AutoCast drops the inputs and
then cannot restore the graph's public inputs. Taking them out of the inputs (their values stay the
weights) gives the model the converters expect.
"""

from __future__ import annotations

from onnx import GraphProto, ModelProto

MIN_IR_WITHOUT = 4
"""The first IR version in which an initializer need not be a graph input."""


def initializer_inputs(graph: GraphProto) -> list[str]:
    """The graph inputs that are also initializers (dense or sparse), in input order."""
    initializers = {t.name for t in graph.initializer}
    initializers.update(s.values.name for s in graph.sparse_initializer)
    return [v.name for v in graph.input if v.name in initializers]


def drop_initializer_inputs(model: ModelProto) -> list[str]:
    """Take the main graph's initializers out of its inputs, in place, raising the IR version to
    `MIN_IR_WITHOUT` where it is lower (where they had to be inputs); the names taken out."""
    names = initializer_inputs(model.graph)
    if names:
        dropped = set(names)
        kept = [v for v in model.graph.input if v.name not in dropped]
        del model.graph.input[:]
        model.graph.input.extend(kept)
        model.ir_version = max(int(model.ir_version), MIN_IR_WITHOUT)
    return names


def describe(names: list[str], ir_version: int) -> str:
    """Words for a model that lists `names` (initializers) among its graph inputs."""
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"{len(names)} initializer(s) also listed as graph inputs at IR {ir_version} ({shown})"
