"""What a model's ONNX graph says about each input's values, read without its weights.

`read_input_hints` walks the graph (subgraphs included) and, per graph input, records the `Gather`
tables it indexes (the smallest one bounds its values) and the `Equal` constants it is compared
with; `core.inputs` turns these hints into the values it generates (see its module docstring).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from enginecache.errors import BadInputError, TestInputError

if TYPE_CHECKING:  # onnx is imported only when a model is read
    import onnx


MAX_CHOICES = 16
"""An Equal constant with more elements than this does not list an input's valid values."""

# Ops whose output carries the values of input `index` (so a bound on the output binds the input).
_PASS_THROUGH: dict[str, tuple[int, ...] | None] = {
    "Cast": (0,),
    "CastLike": (0,),
    "Identity": (0,),
    "Unsqueeze": (0,),
    "Squeeze": (0,),
    "Reshape": (0,),
    "Flatten": (0,),
    "Expand": (0,),
    "Transpose": (0,),
    "Slice": (0,),
    "Tile": (0,),
    "Split": (0,),
    "Gather": (0,),  # gathering from the ids keeps their values
    "Concat": None,  # every input
}
# Ops through which a table's shape (axis 0 kept) is traced back to its initializer.
_TABLE_THROUGH = frozenset({"Cast", "CastLike", "Identity", "DequantizeLinear"})
# com.microsoft EmbedLayerNormalization: index input -> the table input it gathers from.
_EMBED_LAYER_NORM = {0: 2, 1: 4, 8: 3}


@dataclass(frozen=True)
class InputHint:
    """What the graph says about one input's values."""

    index_bound: int | None = None  # exclusive: the smallest table the input indexes
    tables: tuple[str, ...] = ()  # the tables it indexes (for the explanation)
    choices: tuple[int | float, ...] = ()  # constants it is compared with (Equal), graph order


class _GraphFacts:
    """Static shapes, small constant values, producers and consumers of every tensor, subgraphs included."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.shapes: dict[str, tuple[int | None, ...]] = {}
        self.values: dict[str, np.ndarray] = {}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = defaultdict(list)
        self._walk(model.graph)

    def _walk(self, graph: onnx.GraphProto) -> None:
        from onnx import AttributeProto

        for init in graph.initializer:
            self.shapes[init.name] = tuple(int(d) for d in init.dims)
            self._keep_value(init.name, init)
        for value in (*graph.input, *graph.value_info, *graph.output):
            if value.name in self.shapes or not value.type.HasField("tensor_type"):
                continue
            dims = value.type.tensor_type.shape.dim
            self.shapes[value.name] = tuple(int(d.dim_value) if d.HasField("dim_value") else None for d in dims)
        for node in graph.node:
            for index, name in enumerate(node.input):
                if name:
                    self.consumers[name].append((node, index))
            for name in node.output:
                self.producer[name] = node
            if node.op_type == "Constant" and node.output:
                self._constant(node)
            for attr in node.attribute:
                if attr.type == AttributeProto.GRAPH:
                    self._walk(attr.g)
                elif attr.type == AttributeProto.GRAPHS:
                    for sub in attr.graphs:
                        self._walk(sub)

    def _keep_value(self, name: str, tensor: onnx.TensorProto) -> None:
        from onnx import TensorProto, numpy_helper

        if tensor.data_location == TensorProto.EXTERNAL or math.prod(tensor.dims) > MAX_CHOICES:
            return
        try:
            self.values[name] = np.asarray(numpy_helper.to_array(tensor))
        except (ValueError, TypeError):
            return

    def _constant(self, node: onnx.NodeProto) -> None:
        from onnx import helper

        out = node.output[0]
        for attr in node.attribute:
            if attr.name == "value":
                self.shapes[out] = tuple(int(d) for d in attr.t.dims)
                self._keep_value(out, attr.t)
            elif attr.name in ("value_int", "value_float", "value_ints", "value_floats"):
                value = np.asarray(helper.get_attribute_value(attr))
                self.shapes[out] = tuple(int(d) for d in value.shape)
                if value.size <= MAX_CHOICES:
                    self.values[out] = value

    def aliases(self, name: str) -> list[str]:
        """`name` and every tensor that carries its values (through pass-through ops)."""
        seen = [name]
        queue = [name]
        while queue:
            for node, index in self.consumers.get(queue.pop(), ()):
                carried = _PASS_THROUGH.get(node.op_type, ())
                if node.domain not in ("", "ai.onnx") or (carried is not None and index not in carried):
                    continue
                for out in node.output:
                    if out and out not in seen:
                        seen.append(out)
                        queue.append(out)
        return seen

    def table_size(self, name: str, axis: int) -> int | None:
        """The size along `axis` of a table, traced back through Cast/DequantizeLinear to its initializer."""
        for _ in range(8):
            shape = self.shapes.get(name)
            if shape:
                dim = shape[axis if axis >= 0 else len(shape) + axis] if -len(shape) <= axis < len(shape) else None
                return dim if dim and dim > 0 else None
            node = self.producer.get(name)
            if node is None or node.op_type not in _TABLE_THROUGH or not node.input:
                return None
            name = node.input[0]
        return None

    def constant(self, name: str) -> np.ndarray | None:
        """A small constant's values, traced back through pass-through ops."""
        for _ in range(8):
            if name in self.values:
                return self.values[name]
            node = self.producer.get(name)
            if node is None or node.op_type not in ("Cast", "CastLike", "Identity", "Reshape", "Unsqueeze", "Squeeze"):
                return None
            name = node.input[0]
        return None


def _hint(facts: _GraphFacts, name: str) -> InputHint | None:
    bounds: list[tuple[int, str]] = []
    choices: list[int | float] = []
    for alias in facts.aliases(name):
        for node, index in facts.consumers.get(alias, ()):
            if node.op_type == "Gather" and index == 1 and node.domain in ("", "ai.onnx"):
                axis = next((int(a.i) for a in node.attribute if a.name == "axis"), 0)
                rows = facts.table_size(node.input[0], axis)
                if rows is not None:
                    bounds.append((rows, node.input[0]))
            elif node.op_type == "EmbedLayerNormalization" and index in _EMBED_LAYER_NORM:
                table = _EMBED_LAYER_NORM[index]
                rows = facts.table_size(node.input[table], 0) if len(node.input) > table else None
                if rows is not None:
                    bounds.append((rows, node.input[table]))
            elif node.op_type == "Equal" and node.domain in ("", "ai.onnx") and len(node.input) == 2:
                value = facts.constant(node.input[1 - index])
                if value is not None:
                    for item in value.ravel().tolist():
                        if item not in choices:
                            choices.append(item)
    if not bounds and not choices:
        return None
    bound = min((b for b, _ in bounds), default=None)
    tables = tuple(dict.fromkeys(t for b, t in bounds if b == bound))
    return InputHint(index_bound=bound, tables=tables, choices=tuple(choices))


def read_input_hints(
    model: Path | onnx.ModelProto, error: type[BadInputError] = TestInputError
) -> dict[str, InputHint]:
    """What the graph says about each graph input's values (see the module docstring), read without
    loading external weights. Inputs the graph says nothing about are absent."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(model, Path):
        try:
            model = onnx.load(str(model), load_external_data=False)
        except (OSError, ValueError, DecodeError) as err:
            raise error(f"cannot read {model.name} to generate inputs for it: {err}") from err
    facts = _GraphFacts(model)
    initializers = {init.name for init in model.graph.initializer}
    hints: dict[str, InputHint] = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        hint = _hint(facts, value.name)
        if hint is not None:
            hints[value.name] = hint
    return hints
