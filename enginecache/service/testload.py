"""Use case: test-load an engine (job kind `test_load`), record the load run, and aggregate them.

A test-load runs on a worker that can load the engine (`routing.load_requirements`): ONNX Runtime
engines on a CPU of their target, TensorRT-RTX engines on a GPU of one of their compute
capabilities. `run_test_load` is the harness run in the job's child (or in-process); its result
is a `LoadRunRecord` whatever the verdict. A CORRUPT verdict also marks the engine CORRUPT.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session, col, select

from enginecache.core.backends.base import TensorIO
from enginecache.core.backends.registry import get_backend
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.validate import CORRUPT, TestLoadResult, TestLoadSpec, tolerances_for, validate_engine
from enginecache.db import queue
from enginecache.db.models import (
    EngineRecord,
    EngineStatus,
    JobRecord,
    JobStatus,
    LoadEventRecord,
    LoadRunRecord,
    ModelRecord,
)
from enginecache.errors import EngineCacheError, StaleLeaseError, TestInputError
from enginecache.service.context import AppContext
from enginecache.service.engines import get_engine
from enginecache.service.models import model_path
from enginecache.service.routing import load_requirements

logger = logging.getLogger(__name__)

DEFAULT_ITERATIONS = 50
TEST_LOAD_TIMEOUT_SECONDS = 900.0
MAX_SAMPLES_KEPT = 1000  # latency samples stored per run (the distribution chart)


def host_target(backend: str, host: HostFingerprint) -> str:
    """This host as a load target: its CPU target for ort, its GPUs' compute capabilities otherwise."""
    if backend == "ort":
        return host.cpu_target
    return ",".join(g.compute_capability for g in host.gpus) or "no-gpu"


def engine_io(engine: EngineRecord) -> tuple[TensorIO, ...]:
    return tuple(TensorIO(t["name"], t["mode"], t["dtype"], tuple(t["shape"])) for t in engine.io)


def submit_test_load(
    app: AppContext,
    engine_id: int,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    batch: int | None = None,
    inputs: Path | None = None,
    tolerances: Mapping[str, float] | None = None,
    timeout_seconds: float = TEST_LOAD_TIMEOUT_SECONDS,
) -> JobRecord:
    """Enqueue a test-load routed to a worker that can load the engine; an identical active request is joined.

    The inputs file is copied into the store first, so the worker does not depend on the caller's path.
    Whether a worker can take it is `service.jobs.waiting_reason(app, job)`.
    """
    engine = get_engine(app, engine_id)
    if engine.status != EngineStatus.READY or engine.blob_path is None:
        raise TestInputError(f"engine {engine_id} is {engine.status}: only READY engines can be test-loaded")
    if iterations < 0:
        raise TestInputError(f"iterations must be >= 0, got {iterations}")
    if batch is not None and batch <= 0:
        raise TestInputError(f"batch must be positive, got {batch}")
    tolerances_for(engine.precision, tolerances)  # bad tolerance names fail here, not in the job
    inputs_blob = None
    if inputs is not None:
        if not Path(inputs).is_file():
            raise TestInputError(f"inputs file {inputs} does not exist")
        inputs_blob = app.store.ingest_file(Path(inputs))
    payload: dict[str, Any] = {
        "engine_id": engine_id,
        "iterations": iterations,
        "batch": batch,
        "inputs": str(inputs_blob.path) if inputs_blob else None,
        "inputs_sha256": inputs_blob.sha256 if inputs_blob else None,
        "tolerances": dict(tolerances or {}),
    }
    key_source = repr(sorted((k, v) for k, v in payload.items() if k != "inputs"))
    result = queue.enqueue(
        app.catalog,
        kind="test_load",
        payload=payload,
        requirements=load_requirements(engine),
        idempotency_key="test_load:" + hashlib.sha256(key_source.encode()).hexdigest(),
        max_attempts=2,
        timeout_seconds=timeout_seconds,
    )
    return result.job


def run_test_load(
    app: AppContext,
    engine_id: int,
    *,
    iterations: int = DEFAULT_ITERATIONS,
    batch: int | None = None,
    inputs: Path | None = None,
    tolerances: Mapping[str, float] | None = None,
    host: HostFingerprint | None = None,
    job_id: int | None = None,
    commit: Callable[[Callable[[Session], None]], None] | None = None,
) -> LoadRunRecord:
    """Test-load one engine here and record the run (whatever the verdict); returns the record.

    `commit(mutate)` runs the write in a transaction of the caller's choosing (a job passes one that
    checks its lease). Bad input (inputs file, batch) raises TestInputError; nothing is recorded.
    """
    engine = get_engine(app, engine_id)
    if engine.status not in (EngineStatus.READY, EngineStatus.CORRUPT) or engine.blob_path is None:
        raise TestInputError(f"engine {engine_id} is {engine.status}: there is no engine to load")
    with app.catalog.read() as session:
        model = session.get(ModelRecord, engine.model_id)
    if model is None:
        raise TestInputError(f"engine {engine_id}'s model {engine.model_id} is missing from the catalog")
    host = host or host_fingerprint()
    backend = get_backend(engine.backend)
    spec = TestLoadSpec(
        engine_path=app.home / engine.blob_path,
        sha256=engine.sha256 or "",
        blake3=engine.blake3,
        source_onnx=model_path(app, model),
        io=engine_io(engine),
        profiles=engine.build_options.get("profiles", {}),
        precision=engine.precision,
        backend_version=engine.backend_version,
        targets=tuple(engine.targets.split(",")),
        iterations=iterations,
        batch=batch,
        inputs_path=inputs,
        tolerances=tolerances_for(engine.precision, tolerances),
        label=f"engine {engine_id} ({model.name} {engine.backend} {engine.precision} {engine.targets})",
    )
    result = validate_engine(backend, spec)
    record = _load_run_record(engine, result, host, job_id)

    def write(session: Session) -> None:
        session.add(record)
        if result.verdict == CORRUPT:
            row = session.get(EngineRecord, engine_id)
            if row is not None:
                row.status = EngineStatus.CORRUPT
                session.add(row)

    if commit is not None:
        commit(write)
    else:
        with app.catalog.write() as session:
            write(session)
    logger.info("test-load of engine %s: %s (%s)", engine_id, result.verdict, result.reason)
    return record


def _load_run_record(
    engine: EngineRecord, result: TestLoadResult, host: HostFingerprint, job_id: int | None
) -> LoadRunRecord:
    phases = result.phases
    latency = result.latency
    samples = result.samples_ms
    if len(samples) > MAX_SAMPLES_KEPT:  # keep an even subsample of the sorted distribution
        ordered = sorted(samples)
        step = len(ordered) / MAX_SAMPLES_KEPT
        samples = [ordered[int(i * step)] for i in range(MAX_SAMPLES_KEPT)]
    return LoadRunRecord(
        engine_id=engine.id or 0,
        model_id=engine.model_id,
        job_id=job_id,
        backend=engine.backend,
        precision=engine.precision,
        targets=engine.targets,
        hostname=host.hostname,
        host_target=host_target(engine.backend, host),
        verdict=result.verdict,
        reason=result.reason,
        read_verify_s=phases.get("read_verify"),
        validity_s=phases.get("validity"),
        deserialize_s=phases.get("deserialize"),
        create_context_s=phases.get("create_context"),
        allocate_io_s=phases.get("allocate_io"),
        first_inference_s=phases.get("first_inference"),
        load_s=result.load_seconds,
        iterations=latency.iterations if latency else 0,
        batch=latency.batch if latency else None,
        p50_ms=latency.p50_ms if latency else None,
        p90_ms=latency.p90_ms if latency else None,
        p99_ms=latency.p99_ms if latency else None,
        mean_ms=latency.mean_ms if latency else None,
        throughput=latency.throughput if latency else None,
        samples_ms=[round(s, 6) for s in samples],
        accuracy=[a.to_dict() for a in result.accuracy],
        tolerances=result.tolerances.to_dict() if result.tolerances else {},
        input_shapes=result.input_shapes,
        details=result.details,
    )


# -- the job kind --------------------------------------------------------------------------


def run_test_load_job(app: AppContext, spec: Any) -> int:
    """JOB_RUNNERS entry for `test_load` (`spec` is service.jobchild.ChildSpec)."""
    from enginecache.service.jobchild import EXIT_RECORDED

    payload = spec.payload
    engine_id = int(payload["engine_id"])

    def commit(mutate: Callable[[Session], None]) -> None:
        spec.finish(app, JobStatus.SUCCEEDED, result_engine_id=engine_id, on_commit=mutate)

    queue.report_progress(app.catalog, spec.job_id, spec.token, progress=0.1, phase="test-load")
    try:
        run_test_load(
            app,
            engine_id,
            iterations=int(payload.get("iterations", DEFAULT_ITERATIONS)),
            batch=payload.get("batch"),
            inputs=Path(payload["inputs"]) if payload.get("inputs") else None,
            tolerances=payload.get("tolerances") or None,
            host=spec.host,
            job_id=spec.job_id,
            commit=commit,
        )
    except StaleLeaseError:
        raise
    except EngineCacheError as err:
        spec.finish(app, JobStatus.FAILED, error=str(err), result_engine_id=engine_id)
    return EXIT_RECORDED


# -- reads for the CLI and the dashboard --------------------------------------------------


def load_run_to_dict(run: LoadRunRecord) -> dict[str, Any]:
    return {
        "id": run.id,
        "engine_id": run.engine_id,
        "model_id": run.model_id,
        "job_id": run.job_id,
        "backend": run.backend,
        "precision": run.precision,
        "targets": run.targets.split(",") if run.targets else [],
        "hostname": run.hostname,
        "host_target": run.host_target,
        "verdict": run.verdict,
        "reason": run.reason,
        "phases": {
            name: getattr(run, f"{name}_s")
            for name in ("read_verify", "validity", "deserialize", "create_context", "allocate_io", "first_inference")
            if getattr(run, f"{name}_s") is not None
        },
        "load_seconds": run.load_s,
        "latency": None
        if run.p50_ms is None
        else {
            "iterations": run.iterations,
            "batch": run.batch,
            "p50_ms": run.p50_ms,
            "p90_ms": run.p90_ms,
            "p99_ms": run.p99_ms,
            "mean_ms": run.mean_ms,
            "throughput": run.throughput,
        },
        "samples_ms": list(run.samples_ms),
        "accuracy": list(run.accuracy),
        "tolerances": dict(run.tolerances),
        "input_shapes": dict(run.input_shapes),
        "details": dict(run.details),
        "created_at": run.created_at.isoformat(),
    }


def list_load_runs(app: AppContext, engine_id: int, *, limit: int = 100) -> list[dict[str, Any]]:
    """An engine's test-load runs, newest first."""
    query = (
        select(LoadRunRecord)
        .where(LoadRunRecord.engine_id == engine_id)
        .order_by(col(LoadRunRecord.created_at).desc(), col(LoadRunRecord.id).desc())
        .limit(limit)
    )
    with app.catalog.read() as session:
        return [load_run_to_dict(r) for r in session.exec(query).all()]


def load_phase_stats(app: AppContext) -> list[dict[str, Any]]:
    """Mean seconds per load phase by model, backend, targets and precision (test-loads that loaded),
    beside the mean cold build time of the same engines: cold build vs warm load."""
    run = LoadRunRecord
    phase_cols = ("read_verify_s", "validity_s", "deserialize_s", "create_context_s", "allocate_io_s", "load_s")
    loaded = col(run.verdict).in_(("PASS", "FAIL"))
    query = (
        sa.select(
            col(ModelRecord.name).label("model"),
            col(run.backend),
            col(run.targets),
            col(run.precision),
            sa.func.count(col(run.id)).label("runs"),
            *[sa.func.avg(getattr(run, c)).label(c) for c in phase_cols],
            sa.func.avg(col(run.first_inference_s)).label("first_inference_s"),
            sa.func.avg(col(run.p50_ms)).label("p50_ms"),
            sa.func.avg(col(EngineRecord.build_seconds)).label("build_s"),
        )
        .join(ModelRecord, col(ModelRecord.id) == col(run.model_id))
        .join(EngineRecord, col(EngineRecord.id) == col(run.engine_id))
        .where(loaded)
        .group_by(col(ModelRecord.name), col(run.backend), col(run.targets), col(run.precision))
        .order_by(col(ModelRecord.name), col(run.backend), col(run.precision))
    )
    with app.catalog.read() as session:
        rows = session.execute(query).mappings().all()
    return [{k: (float(v) if isinstance(v, float) else v) for k, v in row.items()} for row in rows]


def load_event_stats(app: AppContext) -> list[dict[str, Any]]:
    """`load_or_build` calls by model, host and day: counts per outcome and the cache hit rate."""
    event = LoadEventRecord
    day = sa.func.date(col(event.created_at)).label("day")
    hit = sa.case((col(event.outcome) == "hit", 1), else_=0)
    query = (
        sa.select(
            col(event.model_name).label("model"),
            col(event.hostname).label("host"),
            day,
            sa.func.count(col(event.id)).label("calls"),
            sa.func.sum(hit).label("hits"),
            sa.func.sum(sa.case((col(event.outcome) == "miss", 1), else_=0)).label("misses"),
            sa.func.sum(sa.case((col(event.outcome) == "built", 1), else_=0)).label("built"),
            sa.func.sum(sa.case((col(event.outcome) == "rejected", 1), else_=0)).label("rejected"),
            sa.func.avg(col(event.total_s)).label("mean_total_s"),
            sa.func.avg(sa.case((col(event.outcome) == "hit", col(event.total_s)), else_=None)).label("mean_hit_s"),
        )
        .where(col(event.source) == "load_or_build")
        .group_by(col(event.model_name), col(event.hostname), day)
        .order_by(day, col(event.model_name), col(event.hostname))
    )
    with app.catalog.read() as session:
        rows = session.execute(query).mappings().all()
    out = []
    for row in rows:
        data = dict(row)
        data["day"] = str(data["day"])
        data["hits"] = int(data["hits"] or 0)
        data["hit_rate"] = data["hits"] / data["calls"] if data["calls"] else 0.0
        out.append(data)
    return out


__all__ = [
    "TestInputError",
    "list_load_runs",
    "load_event_stats",
    "load_phase_stats",
    "run_test_load",
    "submit_test_load",
]
