"""Test-load inputs from the dashboard (issue 12, point 3): on an engine's page, generated inputs
(the shared generator) or an uploaded .npz, checked against the engine's inputs before anything is
queued (names, dtypes, shapes within the profile: the problem named otherwise), handed to
`submit_test_load(inputs=...)` as the CLI's `test-load --inputs` does; the run's accuracy table per
output with the tolerances it was judged by, and the inputs it used."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from enginecache.db.models import JobRecord, LoadRunRecord
from enginecache.errors import TestInputError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.builds.testinputs import check_engine_inputs, engine_expected_inputs
from enginecache.service.builds.testload import run_test_load
from tests.dashboardkit import Seeded, engine_view, frame, plain


def _npz(**arrays: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def _good() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, 3, 32, 32)).astype(np.float32)


@pytest.fixture
def ort_engine(seeded: Seeded) -> int:
    """An ONNX Runtime engine of the seeded convnet: it test-loads on this machine's CPU."""
    return int(build_engine(seeded.app, BuildRequest(model="convnet", backend="ort")).engine.id or 0)


def _upload_view(engine_id: int, name: str, content: bytes) -> AppTest:
    at = engine_view(engine_id).run()
    at.radio(key="engines_testload_source").set_value("upload").run()
    assert at.button(key="engines_testload").disabled, "no file yet: nothing to test-load with"
    at.get("file_uploader")[0].upload(name, content).run()
    assert not at.exception, at.exception
    return at


@pytest.mark.parametrize(
    ("arrays", "named"),
    [
        ({"image": _good()}, "lacks input(s) input; it has image"),
        ({"input": _good().astype(np.float64)}, "input 'input' is float64, the engine takes float32"),
        ({"input": np.zeros((16, 3, 32, 32), np.float32)}, "dim 0 is 16, outside 1..8"),
        ({"input": np.zeros((2, 3, 32), np.float32)}, "has shape [2, 3, 32] (3 dims), the engine takes 4 dims"),
    ],
    ids=["name", "dtype", "batch", "rank"],
)
def test_an_upload_that_does_not_fit_names_the_problem_and_queues_nothing(
    seeded: Seeded, arrays: dict[str, np.ndarray], named: str
) -> None:
    at = _upload_view(seeded.engine_id, "inputs.npz", _npz(**arrays))
    [error] = [plain(e.value) for e in at.error if "cannot be used" in str(e.value)]
    assert named in error and "inputs.npz" in error
    assert at.button(key="engines_testload").disabled
    with seeded.app.catalog.read() as session:
        assert not session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).all()


def test_the_expected_inputs_are_shown_beside_the_uploader(seeded: Seeded) -> None:
    at = engine_view(seeded.engine_id).run()
    expected = frame(at, "input", "dtype", "shape")
    assert expected.to_dict("records") == [{"input": "input", "dtype": "float32", "shape": "1..8 x 3 x 32 x 32"}]
    assert [e.shape_text for e in engine_expected_inputs(seeded.app, seeded.engine_id)] == ["1..8 x 3 x 32 x 32"]


def test_a_fitting_upload_is_test_loaded_with_and_its_accuracy_shown_with_the_tolerances(
    seeded: Seeded, ort_engine: int
) -> None:
    content = _npz(input=_good(), extra=np.zeros(3))
    at = _upload_view(ort_engine, "my [inputs].npz", content)
    [fits] = [plain(s.value) for s in at.success]
    assert "my [inputs].npz fits the engine's inputs: input float32 [2, 3, 32, 32]" in fits
    assert any("left out: extra" in plain(c.value) for c in at.caption)
    at.button(key="engines_testload").click().run()
    assert not at.exception, at.exception
    with seeded.app.catalog.read() as session:
        [job] = session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).all()
    assert job.payload["inputs_sha256"] == hashlib.sha256(content).hexdigest(), "the uploaded bytes, in the store"

    # a worker runs it (here, in-process: ONNX Runtime on this CPU) and records the run
    run = run_test_load(seeded.app, ort_engine, inputs=Path(job.payload["inputs"]), iterations=2, job_id=job.id)
    assert run.verdict == "PASS", run.reason
    at = engine_view(ort_engine).run()
    assert not at.exception, at.exception
    accuracy = frame(at, "output", "verdict", "atol", "rtol", "min cosine")
    [row] = accuracy.to_dict("records")
    assert row["output"] == "output" and row["verdict"] == "PASS" and row["shape"] == "2 x 10"
    assert (row["atol"], row["rtol"], row["min cosine"]) == ("0.0001", "0.001", "0.99999"), "fp32's tolerances"
    heading = [plain(m.value) for m in at.markdown if "Accuracy against ONNX Runtime" in str(m.value)]
    assert heading and "fp32 tolerances: atol 0.0001, rtol 0.001, min cosine 0.99999" in heading[0]
    used = frame(at, "input", "shape", "made").to_dict("records")
    assert used == [{"input": "input", "shape": "2 x 3 x 32 x 32", "made": f"from {Path(job.payload['inputs']).name}"}]


def test_generated_inputs_are_the_default(seeded: Seeded, ort_engine: int) -> None:
    at = engine_view(ort_engine).run()
    assert at.radio(key="engines_testload_source").value == "generated"
    at.button(key="engines_testload").click().run()
    with seeded.app.catalog.read() as session:
        [job] = session.exec(select(JobRecord).where(JobRecord.kind == "test_load")).all()
    assert job.payload["inputs"] is None
    run_test_load(seeded.app, ort_engine, iterations=1, job_id=job.id)
    at = engine_view(ort_engine).run()
    [made] = frame(at, "input", "shape", "made")["made"].tolist()
    assert not made.startswith("from "), "generated, and said how"
    with seeded.app.catalog.read() as session:
        assert session.exec(select(LoadRunRecord)).one().verdict == "PASS"


def test_the_service_check_is_the_one_the_dashboard_uses(seeded: Seeded, tmp_path: Path) -> None:
    good = tmp_path / "good.npz"
    good.write_bytes(_npz(input=_good()))
    assert [c.shape for c in check_engine_inputs(seeded.app, seeded.engine_id, good).inputs] == [(2, 3, 32, 32)]
    bad = tmp_path / "bad.npz"
    bad.write_bytes(_npz(input=_good().astype(np.float16)))
    with pytest.raises(TestInputError, match=r"bad\.npz does not fit the engine: input 'input' is float16"):
        check_engine_inputs(seeded.app, seeded.engine_id, bad)
