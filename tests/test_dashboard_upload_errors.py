"""Upload errors for people (issue 28, point 10): one line naming the file and the cause, with no
server path (the upload's staging folder) and no library's own text (protobuf's); the whole error,
its paths still left out, behind Details."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.service.context import AppContext
from tests.dashboardkit import plain, served_catalog, view


@pytest.fixture
def catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    """An empty catalog."""
    with served_catalog(tmp_path / "home", monkeypatch) as ctx:
        yield ctx


def test_a_broken_upload_is_one_line_naming_the_file_and_the_cause(catalog: AppContext) -> None:
    at = view("models").run()
    at.get("file_uploader")[0].upload("resnet.onnx", b"this is not a protobuf at all" * 10).run()  # type: ignore[union-attr]
    at.button(key="models_upload_submit").click().run()
    assert not at.exception, at.exception
    [error] = [plain(e.value) for e in at.error]
    assert error == "upload rejected: resnet.onnx is not an ONNX model: it does not parse as an ONNX ModelProto"
    [details] = [c.value for c in at.code]
    assert details.startswith("InvalidModelError: resnet.onnx is not an ONNX model") and "protobuf says" in details
    for shown in (error, details):
        assert str(catalog.home) not in shown and "upload-" not in shown and "/tmp" not in shown, shown
    assert [e.label for e in at.expander if e.label == "Details"] == ["Details"]
