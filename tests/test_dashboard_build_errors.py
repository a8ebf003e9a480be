"""Build errors for people (issue 28, point 10): a failed build's card says in one line which model
failed and why, with no server path; the whole error (a builder's log lines) behind Details."""

from __future__ import annotations

from tests.dashboardkit import Seeded, add_failed_build, plain, view


def test_a_failed_build_is_one_line_naming_the_model_and_the_cause(seeded: Seeded) -> None:
    home = str(seeded.app.home)
    error = (
        f"TensorRT-RTX could not build {home}/tmp/build-x1/convnet.onnx: out of GPU memory\n"
        "[E] [TRT] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code 2: OutOfMemory\n"
        "[E] [TRT] 4: [builder.cpp::buildSerializedNetwork::751] Error Code 4: API Usage Error"
    )
    with seeded.app.catalog.write() as session:
        add_failed_build(session, seeded.model_id, error, "d" * 64)
    at = view("build").run()
    assert not at.exception, at.exception
    [line] = [plain(e.value) for e in at.error if "out of GPU memory" in plain(e.value)]
    assert line == "FAILED: convnet: TensorRT-RTX could not build tmp/build-x1/convnet.onnx: out of GPU memory"
    [details] = [c.value for c in at.code if "Error Code 4" in c.value]
    assert home not in details and "OutOfMemory" in details
