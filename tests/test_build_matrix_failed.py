"""`build --matrix` does not rebuild a cell that failed for good (issue 26, finding 7): a cell whose
cache key was last built by a job that ended FAILED is reported ("failed earlier: job N, <reason>;
--retry-failed to build again") and not submitted, and the matrix exits 1 as with any failed cell;
`--retry-failed` builds it again; a job that ended DEAD (transient failures) does not hold a cell back.

The failure is real and deterministic: TensorRT-RTX's ONNX parser refuses the INT32 bias of a QDQ
model that ONNX Runtime's quantizer made with its defaults (tests/test_build.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from sqlmodel import col, select

from enginecache.db.models import JobRecord, JobStatus
from enginecache.service.context import AppContext
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp
from tests.test_build import _int32_bias_qdq

PARSER_SAYS = "conv_b_DequantizeLinear"  # the node TensorRT-RTX's parser names


def _cli(app: AppContext, *args: str) -> list[str]:
    return ["--home", str(app.home), "--db", app.db_url, *args]


def _jobs(app: AppContext) -> list[JobRecord]:
    with app.catalog.read() as session:
        return list(session.exec(select(JobRecord).order_by(col(JobRecord.id))).all())


@pytest.mark.slow
def test_a_cell_that_failed_for_good_is_reported_not_rebuilt_until_retry_failed(
    app_ctx: AppContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    models = tmp_path / "models"
    models.mkdir()
    make_mlp(models / "mlp.onnx")
    _int32_bias_qdq(tmp_path).rename(models / "badq.onnx")
    matrix = tmp_path / "engines.yaml"
    matrix.write_text(
        yaml.safe_dump(
            {
                "models": [
                    {"name": "mlp", "path": "models/mlp.onnx", "backend": "ort"},
                    {"name": "badq", "path": "models/badq.onnx", "backend": "rtx", "targets": ["sm86"]},
                ]
            }
        )
    )
    build = _cli(app_ctx, "build", "--matrix", str(matrix))

    first = run_cli(capsys, *build, "--json")
    assert first.code == 1, first.err
    mlp, bad = first.json()["cells"]
    assert mlp["outcome"] == "built" and bad["outcome"] == "failed" and not bad["failed_earlier"]
    assert PARSER_SAYS in bad["error"], bad["error"]
    failed_job = bad["job_id"]
    jobs = _jobs(app_ctx)
    assert [j.status for j in jobs if j.id == failed_job] == [JobStatus.FAILED]

    again = run_cli(capsys, *build)
    assert again.code == 1, again.err
    line = next(line for line in again.out.splitlines() if line.startswith("badq"))
    assert f"failed earlier: job {failed_job}, " in line and PARSER_SAYS in line, line
    assert line.endswith("; --retry-failed to build again"), line
    assert "\n" not in line
    assert "2 cell(s): 1 ready, 1 failed (1 failed earlier, not built again: --retry-failed to build them)" in again.out
    assert "cached" in next(line for line in again.out.splitlines() if line.startswith("mlp"))
    assert len(_jobs(app_ctx)) == len(jobs), "nothing submitted: the failed cell is not built again"

    as_json = run_cli(capsys, *build, "--json")
    assert as_json.code == 1
    data = json.loads(as_json.out)  # exactly one JSON document
    assert data["failed"] == 1 and data["failed_earlier"] == 1
    [earlier] = [c for c in data["cells"] if c["outcome"] == "failed"]
    assert earlier["failed_earlier"] and earlier["job_id"] == failed_job
    assert earlier["error"].startswith(f"failed earlier: job {failed_job}, ") and PARSER_SAYS in earlier["error"]
    assert len(_jobs(app_ctx)) == len(jobs)

    retried = run_cli(capsys, *build, "--retry-failed", "--json")
    assert retried.code == 1
    [rebuilt] = [c for c in retried.json()["cells"] if c["outcome"] == "failed"]
    assert not rebuilt["failed_earlier"] and rebuilt["job_id"] not in (None, failed_job), rebuilt
    assert PARSER_SAYS in rebuilt["error"]
    assert retried.json()["failed_earlier"] == 0
    assert len(_jobs(app_ctx)) == len(jobs) + 1, "--retry-failed submitted the failed cell again"

    # A job that ran out of attempts at transient failures (DEAD) holds nothing back: built again.
    with app_ctx.catalog.write() as session:
        last = session.get(JobRecord, rebuilt["job_id"])
        assert last is not None
        last.status = JobStatus.DEAD
        session.add(last)
    after_dead = run_cli(capsys, *build, "--json")
    [tried] = [c for c in after_dead.json()["cells"] if c["outcome"] == "failed"]
    assert not tried["failed_earlier"] and tried["job_id"] not in (failed_job, rebuilt["job_id"]), tried
    assert len(_jobs(app_ctx)) == len(jobs) + 2


def test_retry_failed_without_a_matrix_is_a_usage_error(
    app_ctx: AppContext, capsys: pytest.CaptureFixture[str]
) -> None:
    refused = run_cli(capsys, *_cli(app_ctx, "build", "mlp", "--retry-failed"))
    assert refused.code == 2 and "--retry-failed is for --matrix FILE" in refused.err
