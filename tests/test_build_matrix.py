"""`enginecache build --matrix FILE` (a CI prebuild): every model x target x precision of the file found
in the cache or built, one summary line per cell, exit 1 when any cell failed; bad files refused before
anything is submitted, naming where."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlmodel import select

from enginecache.db.models import JobRecord
from enginecache.errors import BadInputError
from enginecache.service.builds.matrix import load_matrix, parse_matrix
from enginecache.service.context import AppContext
from tests.clirunner import run_cli
from tests.modelfactory import make_conv, make_mlp


def _write(folder: Path, data: object) -> Path:
    path = folder / "engines.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _cli(app: AppContext, *args: str) -> list[str]:
    return ["--home", str(app.home), "--db", app.db_url, *args]


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"models": []}, "non-empty `models`"),
        ({"models": [{"name": "m"}], "extra": 1}, "unknown top-level key(s) ['extra']"),
        ({"models": [{"name": "m", "precision": "fp16"}]}, "models[0] has unknown key(s) ['precision']"),
        ({"models": [{"path": "m.onnx"}]}, "models[0] must be a mapping with a `name`"),
        ({"models": [{"name": "m", "precisions": [16]}]}, "models[0].precisions must be a string or a list"),
        ({"models": [{"name": "m", "profiles": ["1x3"]}]}, "models[0].profiles must map each input"),
        ({"defaults": {"name": "x"}, "models": [{"name": "m"}]}, "`defaults` takes only"),
    ],
)
def test_a_bad_matrix_is_refused_naming_where(tmp_path: Path, data: object, says: str) -> None:
    with pytest.raises(BadInputError) as refused:
        load_matrix(_write(tmp_path, data))
    assert says in str(refused.value)


def test_cells_are_models_x_targets_x_precisions_with_defaults_and_calibration_for_int8_only(tmp_path: Path) -> None:
    data = {
        "defaults": {"backend": "rtx", "targets": ["sm86", "sm89"], "precisions": ["fp16"]},
        "models": [
            {
                "name": "a",
                "precisions": ["fp32", "int8"],
                "calibration": "c.npz",
                "profiles": {"x": ["1x4", "2x4", "8x4"]},
            },
            {"name": "b", "backend": "ort", "targets": "x86_64-avx2"},
        ],
    }
    cells = parse_matrix(data, tmp_path)
    labels = [c.label for c in cells]
    rtx = ["a rtx sm86 fp32", "a rtx sm86 int8", "a rtx sm89 fp32", "a rtx sm89 int8"]
    assert labels == [*rtx, "b ort x86_64-avx2 fp16"]
    assert [c.request.calibration for c in cells[:2]] == [None, tmp_path / "c.npz"]
    assert cells[0].request.profiles == ("x=1x4,2x4,8x4",)


@pytest.mark.slow
def test_the_cli_builds_the_matrix_then_finds_it_cached_and_a_failed_cell_exits_1(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_mlp(tmp_path / "models" / "mlp.onnx")
    make_conv(tmp_path / "models" / "conv.onnx")
    data = {
        "defaults": {"backend": "ort"},
        "models": [
            {"name": "mlp", "path": "models/mlp.onnx", "precisions": ["fp32", "fp16"]},
            {"name": "conv", "path": "models/conv.onnx"},
        ],
    }
    matrix = _write(tmp_path, data)
    first = run_cli(capsys, *_cli(app_ctx, "build", "--matrix", str(matrix), "--json"))
    assert first.code == 0, first.err
    cells = first.json()["cells"]
    assert [(c["model"], c["precision"], c["outcome"]) for c in cells] == [
        ("mlp", "fp32", "built"),
        ("mlp", "fp16", "built"),
        ("conv", "fp32", "built"),
    ]
    assert first.json()["failed"] == 0 and all(c["engine_id"] for c in cells)
    again = run_cli(capsys, *_cli(app_ctx, "build", "--matrix", str(matrix)))
    assert again.code == 0 and again.out.count("cached") == 3 and "3 cell(s): 3 ready, 0 failed" in again.out

    data["models"].append({"name": "mlp", "backend": "rtx", "targets": ["sm999"]})
    with_bad = _write(tmp_path, data)
    with app_ctx.catalog.read() as session:
        jobs_before = len(session.exec(select(JobRecord)).all())
    failed = run_cli(capsys, *_cli(app_ctx, "build", "--matrix", str(with_bad), "--json"))
    assert failed.code == 1
    [bad] = [c for c in failed.json()["cells"] if c["outcome"] == "failed"]
    assert "sm999" in bad["error"] and bad["job_id"] is None
    with app_ctx.catalog.read() as session:
        assert len(session.exec(select(JobRecord)).all()) == jobs_before, "a refused cell submits nothing"
    assert json.loads(failed.out)["failed"] == 1


def test_model_and_matrix_together_is_a_usage_error(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    matrix = _write(tmp_path, {"models": [{"name": "m"}]})
    both = run_cli(capsys, *_cli(app_ctx, "build", "mlp", "--matrix", str(matrix)))
    assert both.code == 2 and "not both" in both.err
    neither = run_cli(capsys, *_cli(app_ctx, "build"))
    assert neither.code == 2 and "give a MODEL (or --matrix FILE)" in neither.err
