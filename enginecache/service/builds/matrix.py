"""Use case: a CI prebuild (`enginecache build --matrix engines.yaml`): models x targets x precisions,
each cell found in the cache or built (on the worker pool, or here where no worker can), then one
summary, and a failure when any cell failed.

The file (YAML; `docs/fleet.md` has a full example):

    defaults:              # optional: what every model takes unless it says otherwise
      backend: rtx
      targets: [sm86, sm89]
      precisions: [fp16]
    models:
      - name: resnet18
        path: models/resnet18.onnx     # optional: registered first (new bytes: a new version)
        precisions: [fp32, fp16, int8]
        calibration: calib/resnet18.npz  # int8/fp8 cells only
        profiles: {input: [1x3x224x224, 8x3x224x224, 32x3x224x224]}
        opt_level: 3                   # optional builder options: opt_level, workspace_bytes, converter

One cell per (model, target, precision): a TensorRT engine per compute capability, which is what
`pull` prefers (exact target first); an ORT model's `targets` (default: this host's CPU) works the
same way. Every cell is submitted before any is waited for, so a pool of workers builds them side by
side; a cell a worker cannot take is run here by the one-shot worker (`service.builds.submitwait`). Bad
input (an unknown key, a missing name, a precision that is not a list) is refused before anything is
submitted, naming where in the file it is.

A re-run does not build again what failed for good: a cell whose cache key (the same model bytes,
backend and version, target, precision recipe, build options and OS) was last built by a job that
ended FAILED (a deterministic failure: bad input, the backend's refusal) is not submitted; it fails
at once with "failed earlier: job N, <its reason>; --retry-failed to build again", and the matrix
fails as with any failed cell. A job that ended DEAD (out of attempts at transient failures) or
CANCELLED is built again. `retry_failed` (`--retry-failed`) submits every cell.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enginecache.db.models import JobRecord, JobStatus
from enginecache.errors import BadInputError, EngineCacheError
from enginecache.service.builds.plan import BuildRequest, find_ready_engine, plan_build
from enginecache.service.builds.submit import SubmitResult, failed_earlier, submit_build
from enginecache.service.builds.submitwait import run_and_wait
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model

logger = logging.getLogger(__name__)

MODEL_KEYS = frozenset(
    {
        "name",
        "path",
        "backend",
        "targets",
        "precisions",
        "calibration",
        "profiles",
        "opt_level",
        "workspace_bytes",
        "converter",
    }
)
DEFAULT_KEYS = MODEL_KEYS - {"name", "path", "calibration", "profiles"}


@dataclass(frozen=True)
class MatrixCell:
    model: str
    request: BuildRequest
    path: Path | None = None  # the ONNX file to register first, where the matrix names one

    @property
    def label(self) -> str:
        request = self.request
        return f"{self.model} {request.backend} {','.join(request.targets) or 'default'} {request.precision}"


@dataclass(frozen=True)
class CellResult:
    cell: MatrixCell
    outcome: str  # cached | built | failed
    engine_id: int | None
    job_id: int | None
    error: str | None = None
    failed_earlier: bool = False  # not submitted: its key's last build FAILED (`--retry-failed` builds it)

    def to_dict(self) -> dict[str, Any]:
        request = self.cell.request
        return {
            "model": self.cell.model,
            "backend": request.backend,
            "targets": list(request.targets),
            "precision": request.precision,
            "outcome": self.outcome,
            "engine_id": self.engine_id,
            "job_id": self.job_id,
            "error": self.error,
            "failed_earlier": self.failed_earlier,
        }


def _where(index: int, key: str | None = None) -> str:
    return f"models[{index}]" + (f".{key}" if key else "")


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadInputError(f"matrix: {where} must be a string or a list of strings, not {value!r}")
    return tuple(value)


def _profiles(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise BadInputError(f"matrix: {where} must map each input to [min, opt, max] shapes, not {value!r}")
    return tuple(f"{name}={','.join(_strings(shapes, f'{where}.{name}'))}" for name, shapes in value.items())


def parse_matrix(data: Any, base: Path) -> list[MatrixCell]:
    """The cells of a parsed matrix document; relative paths are taken from `base` (its folder)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("models"), list) or not data["models"]:
        raise BadInputError("matrix: the file must be a mapping with a non-empty `models` list")
    unknown = set(data) - {"defaults", "models"}
    if unknown:
        raise BadInputError(f"matrix: unknown top-level key(s) {sorted(unknown)}; expected defaults, models")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping) or set(defaults) - DEFAULT_KEYS:
        raise BadInputError(f"matrix: `defaults` takes only {sorted(DEFAULT_KEYS)}")
    cells: list[MatrixCell] = []
    for index, entry in enumerate(data["models"]):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            raise BadInputError(f"matrix: {_where(index)} must be a mapping with a `name`")
        unknown = set(entry) - MODEL_KEYS
        if unknown:
            raise BadInputError(f"matrix: {_where(index)} has unknown key(s) {sorted(unknown)}")
        spec = {**defaults, **entry}
        backend = str(spec.get("backend", "rtx"))
        targets = _strings(spec["targets"], _where(index, "targets")) if "targets" in spec else ("",)
        precisions = _strings(spec.get("precisions", "fp32"), _where(index, "precisions"))
        calibration = base / str(entry["calibration"]) if entry.get("calibration") else None
        path = base / str(entry["path"]) if entry.get("path") else None
        for target in targets:
            for precision in precisions:
                request = BuildRequest(
                    model=entry["name"],
                    backend=backend,
                    targets=(target,) if target else (),
                    precision=precision,
                    profiles=_profiles(entry.get("profiles"), _where(index, "profiles")),
                    calibration=calibration if precision in ("int8", "fp8") else None,
                    converter=spec.get("converter"),
                    opt_level=spec.get("opt_level"),
                    workspace_bytes=spec.get("workspace_bytes"),
                )
                cells.append(MatrixCell(entry["name"], request, path))
    return cells


def load_matrix(path: Path) -> list[MatrixCell]:
    """Read and parse a matrix file (YAML; JSON is YAML too)."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise BadInputError(f"matrix: cannot read {path}: {err}") from err
    except yaml.YAMLError as err:
        raise BadInputError(f"matrix: {path} is not valid YAML: {err}") from err
    return parse_matrix(data, path.parent)


def _finished(cell: MatrixCell, submitted: SubmitResult, job: JobRecord | None) -> CellResult:
    if submitted.cache_hit and submitted.engine is not None:
        return CellResult(cell, "cached", submitted.engine.id, None)
    assert job is not None
    if job.status == JobStatus.SUCCEEDED and job.result_engine_id is not None:
        return CellResult(cell, "built", job.result_engine_id, job.id)
    return CellResult(cell, "failed", job.result_engine_id, job.id, f"job {job.id} {job.status}: {job.error}")


def _failed_earlier(app: AppContext, cell: MatrixCell) -> CellResult | None:
    """The cell's result without submitting it, where the last build of its cache key FAILED (a
    deterministic failure, `service.builds.submit.failed_earlier`) and no READY engine has that key
    since; None where it is to be submitted."""
    plan = plan_build(app, cell.request)
    if find_ready_engine(app, plan.cache_key) is not None:
        return None
    job = failed_earlier(app, plan.cache_key)
    if job is None:
        return None
    lines = (job.error or "").strip().splitlines()
    reason = lines[0] if lines else "no reason recorded"
    error = f"failed earlier: job {job.id}, {reason}; --retry-failed to build again"
    return CellResult(cell, "failed", job.result_engine_id, job.id, error, failed_earlier=True)


def run_matrix(
    app: AppContext,
    cells: list[MatrixCell],
    *,
    retry_failed: bool = False,
    on_update: Callable[[JobRecord], None] | None = None,
) -> list[CellResult]:
    """Register the models the matrix names by path, submit every cell, then wait for each (module
    docstring). A cell whose request is refused (bad input for that model) fails alone. A cell whose
    cache key's last build FAILED is not submitted again unless `retry_failed`: it fails at once,
    naming that job and its reason (`CellResult.failed_earlier`)."""
    for path in sorted({c.path for c in cells if c.path is not None}):
        names = sorted({c.model for c in cells if c.path == path})
        for name in names:
            register_model(app, path, name=name, new_version=True)  # new bytes: a new version
    submitted: list[tuple[MatrixCell, SubmitResult | None, CellResult | None]] = []
    for cell in cells:
        try:
            earlier = None if retry_failed else _failed_earlier(app, cell)
            if earlier is not None:
                submitted.append((cell, None, earlier))
                continue
            submitted.append((cell, submit_build(app, cell.request), None))
        except BadInputError as err:
            submitted.append((cell, None, CellResult(cell, "failed", None, None, str(err))))
    results = []
    for cell, result, settled in submitted:
        if result is None:
            assert settled is not None
            results.append(settled)
            continue
        job = None
        if not (result.cache_hit and result.engine is not None):
            assert result.job is not None
            try:
                job = run_and_wait(app, result.job, on_update=on_update)
            except EngineCacheError as err:
                results.append(CellResult(cell, "failed", None, result.job.id, str(err)))
                continue
        results.append(_finished(cell, result, job))
        logger.info("matrix cell %s: %s", cell.label, results[-1].outcome)
    return results
