"""A decoder-only transformer in the Llama layout, written as ONNX with random weights (no download).

The graph is what an exporter of a Llama checkpoint with a KV cache writes:

- inputs: `input_ids` and `position_ids` int64 [batch, seq]; per layer `past_key_values.N.key` and
  `.value` [batch, kv_heads, past, head_dim] in the weights' dtype (past may be 0: the first step);
- per block: RMSNorm, attention (Q/K/V projections, rotary embedding by `position_ids` from cos/sin
  tables, the past concatenated in front of this step's K/V, grouped-query heads repeated to the
  query heads, a causal mask offset by the past length, softmax, output projection), a residual,
  RMSNorm, a SwiGLU MLP (gate, up, down), a residual;
- a final RMSNorm and the LM head;
- outputs: `logits` [batch, seq, vocab] and per layer `present.N.key` / `.value`
  [batch, kv_heads, past + seq, head_dim].

Batch, sequence and past length are dynamic. Weights are stored as external data beside the model
(one `.data` file), in fp16 or fp32. `PRESETS` names the sizes the suite and `make bench` use;
`parameter_count` says what a configuration holds. As a script:

    python tests/llamamodel.py --preset 1b --dtype fp16 --out /tmp/llama-1b/model.onnx
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


@dataclass(frozen=True)
class LlamaConfig:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    max_positions: int = 4096
    rope_theta: float = 10000.0
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


PRESETS: dict[str, LlamaConfig] = {
    # the suite's variant: builds in seconds on TensorRT-RTX and ONNX Runtime
    "tiny": LlamaConfig(vocab=512, hidden=64, layers=2, heads=4, kv_heads=2, ffn=176, max_positions=256),
    "0.1b": LlamaConfig(vocab=32000, hidden=768, layers=8, heads=12, kv_heads=4, ffn=2048),
    # about a billion parameters: 2 GB of fp16 weights (make bench)
    "1b": LlamaConfig(vocab=32000, hidden=2048, layers=18, heads=32, kv_heads=8, ffn=5632),
    "1.5b": LlamaConfig(vocab=32000, hidden=2048, layers=28, heads=32, kv_heads=8, ffn=5632),
}


def parameter_count(config: LlamaConfig) -> int:
    """Weights in the model (the rotary tables are not parameters and are not counted)."""
    h, kv = config.hidden, config.kv_heads * config.head_dim
    block = 2 * h * h + 2 * h * kv + 3 * h * config.ffn + 2 * h
    return 2 * config.vocab * h + config.layers * block + h


class _Graph:
    """Nodes and initializers added in order, each output named uniquely."""

    def __init__(self, dtype: np.dtype, seed: int) -> None:
        self.dtype = dtype
        self.onnx_dtype = helper.np_dtype_to_tensor_dtype(dtype)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self._count = 0

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        self._count += 1
        out = f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"{op_type}_{self._count}", **attrs))
        return out

    def weight(self, name: str, shape: tuple[int, ...], scale: float) -> str:
        values = self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)
        self.initializers.append(numpy_helper.from_array(values.astype(self.dtype), name))
        return name

    def constant(self, name: str, values: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(values, name))
        return name


def _rms_norm(g: _Graph, x: str, weight: str, eps: str) -> str:
    squared = g.op("Mul", [x, x])
    mean = g.op("ReduceMean", [squared], axes=[-1], keepdims=1)
    scale = g.op("Reciprocal", [g.op("Sqrt", [g.op("Add", [mean, eps])])])
    return g.op("Mul", [g.op("Mul", [x, scale]), weight])


def _rotate(g: _Graph, x: str, cos: str, sin: str, halves: tuple[str, str, str, str]) -> str:
    """x * cos + rotate_half(x) * sin, x [batch, heads, seq, head_dim]; `halves`: the Slice bounds."""
    zero, half, end, last = halves
    first = g.op("Slice", [x, zero, half, last])
    second = g.op("Slice", [x, half, end, last])
    rotated = g.op("Concat", [g.op("Neg", [second]), first], axis=-1)
    return g.op("Add", [g.op("Mul", [x, cos]), g.op("Mul", [rotated, sin])])


def build_model(config: LlamaConfig, dtype: str = "fp16", seed: int = 0) -> onnx.ModelProto:
    """The model in memory, weights inside it (save it with `save_model` to get external data)."""
    np_dtype = np.dtype(np.float16 if dtype == "fp16" else np.float32)
    g = _Graph(np_dtype, seed)
    h, d, heads, kvh = config.hidden, config.head_dim, config.heads, config.kv_heads
    init_scale = 1.0 / math.sqrt(h)

    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    angles = np.outer(np.arange(config.max_positions, dtype=np.float64), inv_freq)
    angles = np.concatenate([angles, angles], axis=-1)
    cos_table = g.constant("rope_cos", np.cos(angles).astype(np_dtype))
    sin_table = g.constant("rope_sin", np.sin(angles).astype(np_dtype))
    eps = g.constant("rms_eps", np.array(config.eps, dtype=np_dtype))
    neg = g.constant("mask_min", np.array(-1e4 if dtype == "fp16" else -1e9, dtype=np_dtype))
    zero = g.constant("mask_zero", np.array(0, dtype=np_dtype))
    one_i = g.constant("one_i64", np.array(1, dtype=np.int64))
    scale = g.constant("attn_scale", np.array(1.0 / math.sqrt(d), dtype=np_dtype))
    bshd = g.constant("shape_bshd_q", np.array([0, 0, heads, d], dtype=np.int64))
    bshd_kv = g.constant("shape_bshd_kv", np.array([0, 0, kvh, d], dtype=np.int64))
    bsh = g.constant("shape_bsh", np.array([0, 0, h], dtype=np.int64))
    halves = tuple(
        g.constant(name, np.array([value], dtype=np.int64))
        for name, value in (("rot_zero", 0), ("rot_half", d // 2), ("rot_end", d), ("rot_axis", -1))
    )

    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", g.onnx_dtype, ["batch", "seq", config.vocab])]

    # cos/sin for these positions: [batch, 1, seq, head_dim]
    cos = g.op("Unsqueeze", [g.op("Gather", [cos_table, "position_ids"], axis=0), one_i])
    sin = g.op("Unsqueeze", [g.op("Gather", [sin_table, "position_ids"], axis=0), one_i])

    # the causal mask [seq, past + seq]: position j is hidden from query i when j > past + i
    first_past = "past_key_values.0.key"
    seq_len = g.op("Gather", [g.op("Shape", ["input_ids"]), g.constant("index_1", np.array(1, dtype=np.int64))], axis=0)
    past_len = g.op("Gather", [g.op("Shape", [first_past]), g.constant("index_2", np.array(2, dtype=np.int64))], axis=0)
    total = g.op("Add", [seq_len, past_len])
    rows = g.op("Range", [past_len, total, one_i])
    cols = g.op("Range", [g.constant("zero_i64", np.array(0, dtype=np.int64)), total, one_i])
    hidden_cols = g.op(
        "Greater",
        [
            g.op("Unsqueeze", [cols, g.constant("axis_0", np.array([0], dtype=np.int64))]),
            g.op("Unsqueeze", [rows, g.constant("axis_1", np.array([1], dtype=np.int64))]),
        ],
    )
    mask = g.op("Where", [hidden_cols, neg, zero])

    x = g.op("Gather", [g.weight("embed_tokens", (config.vocab, h), 1.0), "input_ids"], axis=0)
    repeat = heads // kvh
    for layer in range(config.layers):
        p = f"layers.{layer}"
        past_k, past_v = f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"
        inputs += [
            helper.make_tensor_value_info(name, g.onnx_dtype, ["batch", kvh, "past", d]) for name in (past_k, past_v)
        ]
        normed = _rms_norm(g, x, g.constant(f"{p}.input_norm", np.ones(h, dtype=np_dtype)), eps)
        q = g.op("MatMul", [normed, g.weight(f"{p}.q_proj", (h, heads * d), init_scale)])
        k = g.op("MatMul", [normed, g.weight(f"{p}.k_proj", (h, kvh * d), init_scale)])
        v = g.op("MatMul", [normed, g.weight(f"{p}.v_proj", (h, kvh * d), init_scale)])
        q = g.op("Transpose", [g.op("Reshape", [q, bshd])], perm=[0, 2, 1, 3])
        k = g.op("Transpose", [g.op("Reshape", [k, bshd_kv])], perm=[0, 2, 1, 3])
        v = g.op("Transpose", [g.op("Reshape", [v, bshd_kv])], perm=[0, 2, 1, 3])
        q = _rotate(g, q, cos, sin, halves)
        k = _rotate(g, k, cos, sin, halves)
        present_k = g.op("Concat", [past_k, k], axis=2)
        present_v = g.op("Concat", [past_v, v], axis=2)
        g.nodes.append(helper.make_node("Identity", [present_k], [f"present.{layer}.key"]))
        g.nodes.append(helper.make_node("Identity", [present_v], [f"present.{layer}.value"]))
        outputs += [
            helper.make_tensor_value_info(f"present.{layer}.{kind}", g.onnx_dtype, ["batch", kvh, "total", d])
            for kind in ("key", "value")
        ]
        if repeat > 1:  # grouped-query attention: each K/V head serves `repeat` query heads
            reps = g.constant(f"{p}.kv_repeat", np.array([1, repeat, 1, 1], dtype=np.int64))
            present_k = g.op("Tile", [present_k, reps])
            present_v = g.op("Tile", [present_v, reps])
            order = np.arange(heads).reshape(repeat, kvh).T.reshape(-1)  # head i uses K/V head i // repeat
            present_k = g.op("Gather", [present_k, g.constant(f"{p}.kv_order_k", order.astype(np.int64))], axis=1)
            present_v = g.op("Gather", [present_v, g.constant(f"{p}.kv_order_v", order.astype(np.int64))], axis=1)
        scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [present_k], perm=[0, 1, 3, 2])]), scale])
        attn = g.op("Softmax", [g.op("Add", [scores, mask])], axis=-1)
        context = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [attn, present_v])], perm=[0, 2, 1, 3]), bsh])
        x = g.op("Add", [x, g.op("MatMul", [context, g.weight(f"{p}.o_proj", (h, h), init_scale)])])
        normed = _rms_norm(g, x, g.constant(f"{p}.post_norm", np.ones(h, dtype=np_dtype)), eps)
        gate = g.op("MatMul", [normed, g.weight(f"{p}.gate_proj", (h, config.ffn), init_scale)])
        up = g.op("MatMul", [normed, g.weight(f"{p}.up_proj", (h, config.ffn), init_scale)])
        swish = g.op("Mul", [gate, g.op("Sigmoid", [gate])])
        down = g.op(
            "MatMul",
            [g.op("Mul", [swish, up]), g.weight(f"{p}.down_proj", (config.ffn, h), 1.0 / math.sqrt(config.ffn))],
        )
        x = g.op("Add", [x, down])

    x = _rms_norm(g, x, g.constant("final_norm", np.ones(h, dtype=np_dtype)), eps)
    logits = g.op("MatMul", [x, g.weight("lm_head", (h, config.vocab), init_scale)])
    g.nodes.append(helper.make_node("Identity", [logits], ["logits"]))

    graph = helper.make_graph(g.nodes, "llama", inputs, outputs, g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="enginecache-tests")
    model.ir_version = 8
    return model


def save_model(model: onnx.ModelProto, path: Path) -> Path:
    """Write the model with its weights as external data in one file beside it (`<name>.data`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=1024,
    )
    return path


def write_llama(path: Path, preset: str = "tiny", dtype: str = "fp16", seed: int = 0) -> Path:
    """Write the preset's model to `path` (and its weights beside it); returns `path`."""
    return save_model(build_model(PRESETS[preset], dtype, seed), path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--dtype", choices=("fp16", "fp32"), default="fp16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    config = PRESETS[args.preset]
    write_llama(args.out, args.preset, args.dtype, args.seed)
    print(f"{args.out}: {parameter_count(config) / 1e9:.2f}B parameters, {args.dtype}")


if __name__ == "__main__":
    main()
