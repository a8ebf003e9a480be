"""core.inputs and core.input_hints: the one input generator (test-load and calibration) reads the
model's graph, so real models accept what it feeds them; a declared shape too large to allocate is refused up front."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from enginecache.core.backends.base import TensorIO
from enginecache.core.calibration import random_batches, read_model_inputs
from enginecache.core.input_hints import InputHint, read_input_hints
from enginecache.core.inputs import (
    MAX_INPUT_BYTES,
    InputSlot,
    feed_rules,
    generate_feed,
    random_inputs,
)
from enginecache.errors import CalibrationError, TestInputError

SEQ = 6


def _save(
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    inits: list[onnx.TensorProto],
    path: Path,
) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def make_token_model(path: Path) -> Path:
    """BERT-like embeddings: `input_ids` -> a 50-row word table; `kind_ids` (a neutral name) through
    Cast and Unsqueeze/Squeeze -> a 2-row table; `token_type_ids` -> another 2-row table; an
    `attention_mask` scaling the sum. Ids past a table make ONNX Runtime refuse the run."""
    rng = np.random.default_rng(0)
    words = numpy_helper.from_array(rng.standard_normal((50, 8)).astype(np.float32), "words")
    kinds = numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "kinds")
    types_ = numpy_helper.from_array(rng.standard_normal((2, 8)).astype(np.float32), "token_types")
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes0")
    nodes = [
        helper.make_node("Gather", ["words", "input_ids"], ["w"]),
        helper.make_node("Cast", ["kind_ids"], ["k32"], to=TensorProto.INT32),
        helper.make_node("Unsqueeze", ["k32", "axes0"], ["k4"]),
        helper.make_node("Squeeze", ["k4", "axes0"], ["k3"]),
        helper.make_node("Gather", ["kinds", "k3"], ["k"]),
        helper.make_node("Gather", ["token_types", "token_type_ids"], ["t"]),
        helper.make_node("Add", ["w", "k"], ["wk"]),
        helper.make_node("Add", ["wk", "t"], ["wkt"]),
        helper.make_node("Cast", ["attention_mask"], ["mf"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["mf", "axes_last"], ["m3"]),
        helper.make_node("Mul", ["wkt", "m3"], ["embeddings"]),
    ]
    axes_last = numpy_helper.from_array(np.array([-1], np.int64), "axes_last")
    names = ("input_ids", "kind_ids", "token_type_ids", "attention_mask")
    return _save(
        nodes,
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in names],
        [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", "seq", 8])],
        [words, kinds, types_, axes, axes_last],
        path,
    )


def make_vad_like(path: Path) -> Path:
    """silero-VAD's shape of the problem: `If(Equal(sr, 8000))`, else `If(Equal(sr, 16000))`, else a
    branch that cannot run (a Reshape no input fits), so any other sample rate is refused."""
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)

    def branch(name: str, node: onnx.NodeProto, inits: list[onnx.TensorProto] | None = None) -> onnx.GraphProto:
        return helper.make_graph([node], name, [], [out], initializer=inits or [])

    bad_shape = numpy_helper.from_array(np.array([3, 7, 11, 13], np.int64), "bad_shape")
    inner = helper.make_node(
        "If",
        ["is16k"],
        ["y"],
        then_branch=branch("at16k", helper.make_node("Relu", ["audio"], ["y"])),
        else_branch=branch("other", helper.make_node("Reshape", ["audio", "bad_shape"], ["y"]), [bad_shape]),
    )
    nodes = [
        helper.make_node("Constant", [], ["c8k"], value=numpy_helper.from_array(np.array(8000, np.int64))),
        helper.make_node("Constant", [], ["c16k"], value_int=16000),
        helper.make_node("Equal", ["sr", "c8k"], ["is8k"]),
        helper.make_node("Equal", ["c16k", "sr"], ["is16k"]),
        helper.make_node(
            "If",
            ["is8k"],
            ["y"],
            then_branch=branch("at8k", helper.make_node("Neg", ["audio"], ["y"])),
            else_branch=helper.make_graph([inner], "not8k", [], [out]),
        ),
        helper.make_node("Identity", ["y"], ["prob"]),
    ]
    return _save(
        nodes,
        [
            helper.make_tensor_value_info("audio", TensorProto.FLOAT, ["batch", "samples"]),
            helper.make_tensor_value_info("sr", TensorProto.INT64, []),
        ],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", "samples"])],
        [],
        path,
    )


def _run(path: Path, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))


TOKEN_IO = tuple(
    TensorIO(n, "input", "int64", ("batch", "seq"))
    for n in ("input_ids", "kind_ids", "token_type_ids", "attention_mask")
)


def test_gather_indices_are_bounded_by_the_table_they_index(tmp_path: Path) -> None:
    path = make_token_model(tmp_path / "tokens.onnx")
    hints = read_input_hints(path)
    assert hints["input_ids"] == InputHint(index_bound=50, tables=("words",))
    assert hints["kind_ids"].index_bound == 2, "traced through Cast, Unsqueeze and Squeeze"
    assert "attention_mask" not in hints
    shapes = {t.name: (4, SEQ) for t in TOKEN_IO}
    feed = random_inputs(TOKEN_IO, shapes, model=path, seed=3)
    assert feed["input_ids"].min() >= 0 and feed["input_ids"].max() < 50
    assert set(np.unique(feed["kind_ids"]).tolist()) <= {0, 1}
    assert len(np.unique(feed["kind_ids"])) == 2, "both rows of the 2-row table are used"
    assert (feed["token_type_ids"] == 0).all() and (feed["attention_mask"] == 1).all()
    assert all(v.dtype == np.int64 for v in feed.values())
    assert _run(path, feed)[0].shape == (4, SEQ, 8)  # ONNX Runtime takes them

    old_rules = random_inputs(TOKEN_IO, shapes, seed=3)  # without the model: name rules only
    assert old_rules["kind_ids"].max() >= 2
    with pytest.raises(Exception, match=r"idx=\d+ must be within the inclusive range \[-2,1\]"):
        _run(path, old_rules)  # what the issue saw: the model rejects ids past its table

    slots = [InputSlot(t.name, np.dtype(np.int64), (4, SEQ)) for t in TOKEN_IO]
    rules = {name: rule.describe() for name, rule in feed_rules(slots, hints).items()}
    assert rules["kind_ids"] == "integers in [0, 2) (Gather indices into kinds)"
    assert rules["token_type_ids"].startswith("all zeros") and rules["attention_mask"].startswith("all ones")


def test_a_scalar_compared_in_if_conditions_takes_a_value_the_graph_accepts(tmp_path: Path) -> None:
    path = make_vad_like(tmp_path / "vad.onnx")
    hints = read_input_hints(path)
    assert hints["sr"].choices == (8000, 16000), "both Equal constants, graph order, subgraphs included"
    io = (TensorIO("audio", "input", "float32", ("batch", "samples")), TensorIO("sr", "input", "int64", ()))
    feed = random_inputs(io, {"audio": (1, 512), "sr": ()}, model=path)
    assert feed["sr"].shape == () and feed["sr"].dtype == np.int64 and int(feed["sr"]) == 8000
    assert feed["audio"].dtype == np.float32 and abs(float(feed["audio"].std()) - 1.0) < 0.2
    np.testing.assert_array_equal(_run(path, feed)[0], -feed["audio"])
    with pytest.raises(Exception, match="Reshape"):
        _run(path, {**feed, "sr": np.array(44100, np.int64)})  # any other rate is refused by the model

    slot = InputSlot("sr", np.dtype(np.int64), (1,))  # one element counts as a scalar
    assert generate_feed([slot], np.random.default_rng(0), hints=hints)["sr"].tolist() == [8000]
    narrow = InputSlot("sr", np.dtype(np.int8), ())  # neither value fits int8: the integer rule instead
    value = int(generate_feed([narrow], np.random.default_rng(0), hints=hints)["sr"])
    assert 0 <= value < 100


def test_embed_layer_normalization_and_quantized_tables_bound_ids() -> None:
    words = numpy_helper.from_array(np.zeros((30, 4), np.int8), "wq")
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "s")
    segments = numpy_helper.from_array(np.zeros((3, 4), np.float32), "seg")
    nodes = [
        helper.make_node("DequantizeLinear", ["wq", "s"], ["wf"]),
        helper.make_node("Gather", ["wf", "ids"], ["e"]),
        helper.make_node(
            "EmbedLayerNormalization",
            ["ids", "segment_ids", "wf", "pos", "seg", "g", "b"],
            ["out", "mask_index"],
            domain="com.microsoft",
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "embed",
        [helper.make_tensor_value_info(n, TensorProto.INT32, ["b", "s"]) for n in ("ids", "segment_ids")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        initializer=[words, scale, segments],
    )
    hints = read_input_hints(helper.make_model(graph))
    assert hints["ids"].index_bound == 30 and hints["segment_ids"].index_bound == 3


def test_a_declared_size_too_large_is_refused_with_the_bytes_it_needs() -> None:
    huge = (1, 2**40, 2**40)
    io = (TensorIO("x", "input", "float32", huge),)
    nbytes = 4 * 2**80
    pattern = rf"input 'x' of shape \[1, {2**40}, {2**40}\] \(float32\) would need {nbytes} bytes"
    with pytest.raises(TestInputError, match=pattern):
        random_inputs(io, {"x": huge})
    just_over = InputSlot("x", np.dtype(np.float16), (MAX_INPUT_BYTES // 2 + 1,))
    with pytest.raises(CalibrationError, match=f"limited to {MAX_INPUT_BYTES} bytes"):
        generate_feed([just_over], np.random.default_rng(0), CalibrationError)


def test_names_and_dtypes_without_a_model_keep_the_old_rules() -> None:
    slots = [
        InputSlot("pixels", np.dtype(np.float32), (2, 3)),
        InputSlot("float_mask", np.dtype(np.float32), (2, 3)),
        InputSlot("flags", np.dtype(np.bool_), (2,)),
        InputSlot("position_ids", np.dtype(np.int64), (2, 4)),
        InputSlot("count", np.dtype(np.int32), (3,)),
    ]
    feed = generate_feed(slots, np.random.default_rng(0))
    assert feed["pixels"].dtype == np.float32 and (feed["float_mask"] == 1).all() and feed["flags"].all()
    assert feed["position_ids"].tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]]
    assert feed["count"].dtype == np.int32 and feed["count"].min() >= 0 and feed["count"].max() < 100
    with pytest.raises(TestInputError, match="'text' of type <U1 cannot be fed"):
        generate_feed([InputSlot("text", np.dtype("<U1"), (1,))], np.random.default_rng(0))


def test_calibration_batches_come_from_the_same_generator(tmp_path: Path) -> None:
    path = make_token_model(tmp_path / "tokens.onnx")
    inputs = read_model_inputs(path)
    shapes = {inp.name: (2, SEQ) for inp in inputs}
    batches = random_batches(inputs, shapes, batches=3, model=path)
    assert len(batches) == 3
    for feed in batches:
        assert feed["kind_ids"].max() <= 1 and feed["input_ids"].max() < 50
        assert (feed["token_type_ids"] == 0).all() and (feed["attention_mask"] == 1).all()
        _run(path, feed)  # every calibration batch runs through the model
    assert not np.array_equal(batches[0]["input_ids"], batches[1]["input_ids"]), "batches differ"
    again = random_batches(inputs, shapes, batches=3, model=path)
    assert all(np.array_equal(a["input_ids"], b["input_ids"]) for a, b in zip(batches, again, strict=True))
    # test-load's first feed is calibration's first batch: one generator, one seed
    first = random_inputs(TOKEN_IO, shapes, model=path, seed=0)
    assert all(np.array_equal(first[k], batches[0][k]) for k in first)
    with pytest.raises(CalibrationError, match="would need"):
        random_batches(inputs, {inp.name: (2**20, 2**20) for inp in inputs}, model=path)
