"""Graph repairs for onnxconverter-common's fp16 conversion (`lightfp16`).

On its own the converter leaves graphs that are invalid, or that TensorRT refuses, in five ways,
each fixed here:

1. A `Cast(to=FLOAT)` of the source keeps `to=FLOAT` while the converter retypes its output to
   float16 ("Inferred elem type differs ... (float) vs (float16)": Llama's rotary embedding, a
   YOLO head, a jax2tf one-hot, an STFT). Every such Cast outside the fp32 nodes is made to cast
   to FLOAT16.
2. A float graph input used only inside an If/Loop/Scan body is left float32 while the body is
   converted (silero-VAD's STFT inside its `If`): a Cast to fp16 is added in the main graph and
   the bodies read it.
3. Nodes left unnamed get the converter's inserted Casts names that collide: every node is
   named (`<op>_ec<n>`) before converting.
4. A Cast to float16 feeding a Cast back to float (a repaired Cast in front of a kept-fp32 op)
   becomes one Cast to float: TensorRT refuses a half shape tensor on the way (a YOLO head's
   int64 -> fp16 -> fp32 into Range), and integers past 2048 stay exact.
5. A float initializer shared by a node kept in fp32 and a converted one stays float32 for both
   (a jax2tf LayerNorm's reciprocal): the fp32 nodes get their own copy.

Points 3 and 5 run on the model before converting (`name_nodes`, `split_shared_initializers`),
points 1, 2 and 4 on the converted model (`repair`).
"""

from __future__ import annotations

from collections.abc import Iterator

import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto

from enginecache.core.onnx_graph import subgraphs, walk


def nested_nodes(model: ModelProto) -> Iterator[NodeProto]:
    """Nodes of the main graph and of every subgraph nested in it."""
    for graph in walk([model.graph]):
        yield from graph.node


def name_nodes(model: ModelProto) -> int:
    """Give every unnamed node (subgraphs included) a unique name; the number named."""
    nodes = list(nested_nodes(model))
    taken = {node.name for node in nodes if node.name}
    count = 0
    for node in nodes:
        if node.name:
            continue
        index = count
        while f"{node.op_type}_ec{index}" in taken:
            index += 1
        node.name = f"{node.op_type}_ec{index}"
        taken.add(node.name)
        count += 1
    return count


def split_shared_initializers(model: ModelProto, block_ops: set[str], blocked: set[str]) -> int:
    """Give fp32 nodes their own copy of a float initializer they share with converted nodes
    (module docstring, point 5); the number of copies made."""
    graph = model.graph
    inits = {init.name: init for init in graph.initializer if init.data_type == TensorProto.FLOAT}
    kept: dict[str, list[NodeProto]] = {}
    converted: set[str] = set()
    for node in graph.node:
        fp32 = node.op_type in block_ops or node.name in blocked
        for name in node.input:
            if name in inits:
                if fp32:
                    kept.setdefault(name, []).append(node)
                else:
                    converted.add(name)
        if not fp32:
            converted.update(n for sub in walk(list(subgraphs(node))) for x in sub.node for n in x.input if n in inits)
    copies = 0
    for name, nodes in kept.items():
        if name not in converted:
            continue
        copy = graph.initializer.add()
        copy.CopyFrom(inits[name])
        copy.name = f"{name}_ec_fp32"
        for node in nodes:
            for i, value in enumerate(node.input):
                if value == name:
                    node.input[i] = copy.name
        copies += 1
    return copies


def repair(model: ModelProto, casts: set[str], block_ops: set[str], blocked: set[str]) -> None:
    """Fix what the converter leaves inconsistent (module docstring, points 1 and 2, then 4), given
    the source's Casts (`casts`) and what it kept in fp32: the ops of `block_ops`, the nodes named
    in `blocked`."""
    for node in _converted_nodes(model, block_ops, blocked):
        if node.op_type == "Cast" and node.name in casts:
            for attr in node.attribute:
                if attr.name == "to" and attr.i == TensorProto.FLOAT:
                    attr.i = TensorProto.FLOAT16
    _cast_outer_inputs(model, block_ops, blocked)
    for graph in walk([model.graph]):
        _collapse_cast_pairs(graph)


def _cast_to(node: NodeProto) -> int | None:
    return next((attr.i for attr in node.attribute if attr.name == "to"), None) if node.op_type == "Cast" else None


def _collapse_cast_pairs(graph: GraphProto) -> None:
    """`Cast(to=FLOAT16)` followed by `Cast(to=FLOAT)` becomes one `Cast(to=FLOAT)` of the first
    Cast's input (module docstring, point 4): exact for integer inputs past 2048, and TensorRT
    refuses half shape tensors (int64 -> fp16 -> fp32 into a kept-fp32 Range of a YOLO head)."""
    producers = {out: node for node in graph.node for out in node.output}
    for node in graph.node:
        if _cast_to(node) != TensorProto.FLOAT or not node.input:
            continue
        first = producers.get(node.input[0])
        if first is not None and _cast_to(first) == TensorProto.FLOAT16 and first.input:
            node.input[0] = first.input[0]
    used = {name for node in graph.node for name in node.input}
    used |= {name for node in graph.node for sub in walk(list(subgraphs(node))) for n in sub.node for name in n.input}
    used |= {value.name for value in graph.output}
    dead = [node for node in graph.node if node.op_type == "Cast" and not any(out in used for out in node.output)]
    for node in dead:
        graph.node.remove(node)


def _cast_outer_inputs(model: ModelProto, block_ops: set[str], blocked: set[str]) -> None:
    graph = model.graph
    float_inputs = {v.name for v in graph.input if v.type.tensor_type.elem_type == TensorProto.FLOAT}
    if not float_inputs:
        return
    bodies = [
        sub
        for node in graph.node
        if node.op_type not in block_ops and node.name not in blocked
        for sub in subgraphs(node)
    ]
    used = {name for body in walk(bodies) for node in body.node for name in node.input if name in float_inputs}
    if not used:
        return
    renames: dict[str, str] = {}
    for name in sorted(used):
        cast_out = f"{name}_ec_fp16_outer"
        graph.node.insert(
            0, onnx.helper.make_node("Cast", [name], [cast_out], name=f"{name}_ec_cast_outer", to=TensorProto.FLOAT16)
        )
        renames[name] = cast_out
    for body in walk(bodies):
        for node in body.node:
            for i, name in enumerate(node.input):
                if name in renames:
                    node.input[i] = renames[name]


def _converted_nodes(model: ModelProto, block_ops: set[str], blocked: set[str]) -> Iterator[NodeProto]:
    """Nodes the converter turned to fp16: not blocked, and not inside a blocked node's bodies."""
    stack: list[GraphProto] = [model.graph]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            if node.op_type in block_ops or node.name in blocked:
                continue
            yield node
            stack.extend(attr.g for attr in node.attribute if attr.type == AttributeProto.GRAPH)
            stack.extend(g for attr in node.attribute if attr.type == AttributeProto.GRAPHS for g in attr.graphs)
