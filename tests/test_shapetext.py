"""Shapes as people read them, from the dims exporters really write (PaddleOCR's p2o names, tf2onnx's
unk__N, an unknown '?'), with a person's names kept."""

from __future__ import annotations

import pytest

from enginecache.core.shapetext import shape_text


@pytest.mark.parametrize(
    ("shape", "text"),
    [
        (["p2o.DynamicDimension.0", 3, 48, "p2o.DynamicDimension.1"], "batch x 3 x 48 x width"),
        (["?", 3, "?", "?"], "batch x 3 x height x width"),
        (["unk__214", "unk__215", 384], "batch x sequence x 384"),
        (["batch", "sequence"], "batch x sequence"),
        (["N", 1, "H", "W"], "batch x 1 x H x W"),
        (["floor(n/2)", 64], "batch x 64"),
        ([2, 1, 128], "2 x 1 x 128"),
        (["?"], "dim0"),
        ([], "scalar"),
    ],
)
def test_shape_text(shape: list[int | str], text: str) -> None:
    assert shape_text(shape) == text
