"""Use case: test-load an engine: submit it as a job, or run it here and record the load run.

A test-load runs on a worker that can load the engine (`routing.load_requirements`, the backend's
answer): ONNX Runtime engines on a CPU of their target, TensorRT-RTX engines on a GPU of one of
their compute capabilities. `run_test_load` is the harness run in the job's child
(`service.builds.testloadjob`) or in-process; its result is a `LoadRunRecord` whatever the verdict, an
ERROR with the reason included (inputs the model rejects, a shape too large to generate), so the
engine page always shows the last attempt. A CORRUPT verdict also marks the engine CORRUPT; a PASS
of an UNPROVEN (imported) engine proves it (`db.engines.mark_proven`: READY, audited), in the same
transaction as the run.
The accuracy reference (ONNX Runtime on the fp32 source) reads a private copy of the source bundle,
hashed in the pass that copied it (`modelverify.stage_bundle`); a source that no longer hashes to its
digest is an ERROR run naming it.
Reading the runs back is `service.engines.loadruns`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session

from enginecache.core.backends.registry import get_backend
from enginecache.core.blobpaths import blob_path
from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.core.profiles import resolve_profile
from enginecache.core.signing import policy
from enginecache.core.validate import (
    CORRUPT,
    ERROR,
    FAIL,
    PASS,
    TestLoadResult,
    TestLoadSpec,
    tolerances_for,
    validate_engine,
)
from enginecache.db import engines, queue
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, LoadRunRecord, ModelRecord, utcnow
from enginecache.db.sqlexec import AlchemyExecutor
from enginecache.errors import BadInputError, EngineCacheError, StaleLeaseError, TestInputError, UnavailableError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.builds.testinputs import check_inputs
from enginecache.service.context import AppContext
from enginecache.service.engines.records import get_engine
from enginecache.service.engines.signatures import check_row
from enginecache.service.jobs.refs import engine_io, engine_targets
from enginecache.service.jobs.routing import load_requirements
from enginecache.service.models.register import model_inputs
from enginecache.service.models.verify import stage_bundle

logger = logging.getLogger(__name__)

DEFAULT_ITERATIONS = 50
TEST_LOAD_TIMEOUT_SECONDS = 900.0
MAX_SAMPLES_KEPT = 1000  # latency samples stored per run (the distribution chart)
_LOADABLE = (EngineStatus.READY, EngineStatus.UNPROVEN)  # what a test-load is asked for (UNPROVEN: to prove it)


@dataclass(frozen=True)
class TestLoadOptions:
    """What a test-load asks for: timed iterations after the first inference, the batch (None: the
    profile's opt shape), an .npz of inputs by name (None: random) and tolerance overrides by name.

    `submit_test_load` and `run_test_load` take one, or these fields as keyword arguments (`of`)."""

    __test__ = False  # not a pytest class

    iterations: int = DEFAULT_ITERATIONS
    batch: int | None = None
    inputs: Path | None = None
    tolerances: Mapping[str, float] | None = None

    @classmethod
    def of(cls, options: TestLoadOptions | None, fields: Mapping[str, Any]) -> TestLoadOptions:
        """`options` (default: the defaults) with `fields` (keyword arguments of the caller's) replaced;
        a name that is no field raises TypeError."""
        return dataclasses.replace(options or cls(), **fields)


def submit_test_load(
    app: AppContext,
    engine_id: int,
    options: TestLoadOptions | None = None,
    *,
    timeout_seconds: float = TEST_LOAD_TIMEOUT_SECONDS,
    **fields: Any,
) -> JobRecord:
    """Enqueue a test-load routed to a worker that can load the engine; an identical active request is joined.

    `fields` are `TestLoadOptions` fields (iterations, batch, inputs, tolerances), given instead of
    or over `options`. The inputs file is copied into the store first, so the worker does not depend
    on the caller's path. Whether a worker can take it is `service.builds.submit.waiting_reason(app, job)`.
    """
    access.require(app, "test_load")
    options = TestLoadOptions.of(options, fields)
    engine = get_engine(app, engine_id)
    if engine.status not in _LOADABLE or engine.blob_path is None:
        raise TestInputError(
            f"engine {engine_id} is {engine.status}: only READY and UNPROVEN engines can be test-loaded"
        )
    if options.iterations < 0:
        raise TestInputError(f"iterations must be >= 0, got {options.iterations}")
    if options.batch is not None and options.batch <= 0:
        raise TestInputError(f"batch must be positive, got {options.batch}")
    tolerances_for(engine.precision, options.tolerances)  # bad tolerance names fail here, not in the job
    inputs_blob = None
    if options.inputs is not None:
        if not Path(options.inputs).is_file():
            raise TestInputError(f"inputs file {options.inputs} does not exist")
        # every name, dtype and dimension against the engine's profile, as the dashboard checks it
        check_inputs(Path(options.inputs), engine_io(engine), engine.build_options.get("profiles", {}))
        inputs_blob = app.store.ingest_file(Path(options.inputs))
    payload: dict[str, Any] = {
        "engine_id": engine_id,
        "iterations": options.iterations,
        "batch": options.batch,
        "inputs": str(inputs_blob.path) if inputs_blob else None,
        "inputs_sha256": inputs_blob.sha256 if inputs_blob else None,
        "tolerances": dict(options.tolerances or {}),
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
        submitted_by=audit.current_actor().name,
    )
    if not result.joined:
        details = {k: payload[k] for k in ("iterations", "batch", "inputs_sha256", "tolerances")}
        audit.record(app, audit.TEST_LOAD_SUBMIT, f"engine {engine_id}", {"job_id": result.job.id, **details})
    return result.job


def run_test_load(
    app: AppContext,
    engine_id: int,
    options: TestLoadOptions | None = None,
    *,
    host: HostFingerprint | None = None,
    job_id: int | None = None,
    commit: Callable[[Callable[[Session], None], LoadRunRecord], None] | None = None,
    **fields: Any,
) -> LoadRunRecord:
    """Test-load one engine here and record the run (whatever the verdict); returns the record.

    `fields` are `TestLoadOptions` fields (iterations, batch, inputs, tolerances), given instead of
    or over `options`.

    Every outcome is a recorded run: a request or inputs the engine cannot take (batch outside the
    profile, an inputs file that does not fit, a declared shape too large to generate, inputs the
    model rejects, an engine with nothing to load) is an ERROR run with the reason, as is a load or
    inference the backend refused. Only a missing engine or model row raises (nothing to record a
    run against), and so do an unavailable catalog or store and a lost lease (not the engine's
    fault). `commit(mutate, record)` runs the write in a transaction of the caller's choosing (a job
    passes one that checks its lease and sets the job's state from the verdict).
    """
    options = TestLoadOptions.of(options, fields)
    engine = get_engine(app, engine_id)
    with app.catalog.read() as session:
        model = session.get(ModelRecord, engine.model_id)
    if model is None:
        raise TestInputError(f"engine {engine_id}'s model {engine.model_id} is missing from the catalog")
    host = host or host_fingerprint()
    try:
        if (engine.provenance or {}).get("bundle"):  # an engine bundle: its rank files load only in its runtime
            raise BadInputError(
                f"engine {engine_id} is an engine bundle: its runtime (TensorRT-LLM) loads its folder, which "
                "enginecache does not test-load; `enginecache verify` checks every file of it"
            )
        result = _validate(app, engine, model, options)
    except (UnavailableError, StaleLeaseError):
        raise
    except EngineCacheError as err:  # deterministic: recorded, not retried
        result = TestLoadResult(verdict=ERROR, reason=str(err), details={"error_type": type(err).__name__})
    record = _load_run_record(engine, result, host, job_id)

    actor = audit.current_actor()

    def write(session: Session) -> None:
        session.add(record)
        if result.verdict == CORRUPT:
            details = {"job_id": job_id}
            ex = AlchemyExecutor(session.connection())
            engines.mark_corrupt(ex, engine_id, actor=actor, by="test-load", reason=result.reason, details=details)
        elif result.verdict == PASS and engine.status == EngineStatus.UNPROVEN:
            ex = AlchemyExecutor(session.connection())
            proof = {"job_id": job_id, "host_target": record.host_target}
            at, by = utcnow(), "test-load"
            engines.mark_proven(ex, engine_id, at=at, host=host.hostname, actor=actor, by=by, details=proof)
        if result.verdict in (PASS, FAIL):  # it loaded and ran: every byte read matched the digest
            ex = AlchemyExecutor(session.connection())
            engines.mark_verified(
                ex,
                engine_id,
                at=utcnow(),
                blob_path=app.store.relative(blob_path(app.home, engine.sha256)),
                header_blake3=engine.header_blake3,
                chunk_blake3=engine.chunk_blake3,
                actor=actor,
                by="test-load",
                reason=f"test-load {result.verdict}: the blob read matched its digest",
            )

    if commit is not None:
        commit(write, record)
    else:
        with app.catalog.write() as session:
            write(session)
    logger.info("test-load of engine %s: %s (%s)", engine_id, result.verdict, result.reason)
    return record


def _validate(app: AppContext, engine: EngineRecord, model: ModelRecord, options: TestLoadOptions) -> TestLoadResult:
    if engine.status not in (*_LOADABLE, EngineStatus.CORRUPT) or engine.blob_path is None:
        raise TestInputError(f"engine {engine.id} is {engine.status}: there is no engine to load")
    checks = policy()
    if checks is not None:  # ProvenanceError: an ERROR run saying why (a changed row is marked TAMPERED)
        check_row(app, engine, checks, by="test-load")
    with app.store.temp_dir(prefix=f"test-load-{engine.id}-") as work:
        # The accuracy reference runs on a verified private copy of the source model (a CORRUPT one
        # raises IntegrityCheckError: an ERROR run naming the model), never on the store's file.
        return validate_engine(get_backend(engine.backend), _spec(app, engine, model, options, work))


def _spec(
    app: AppContext, engine: EngineRecord, model: ModelRecord, options: TestLoadOptions, work: Path
) -> TestLoadSpec:
    return TestLoadSpec(
        engine_path=blob_path(app.home, engine.sha256),  # the digest's path, never the row's
        sha256=engine.sha256 or "",
        blake3=engine.blake3,
        source_onnx=stage_bundle(app, model, work / "source"),
        io=engine_io(engine),
        profiles=engine.build_options.get("profiles") or _default_profiles(engine, model),
        precision=engine.precision,
        backend_version=engine.backend_version,
        targets=engine_targets(engine),
        iterations=options.iterations,
        batch=options.batch,
        inputs_path=options.inputs,
        tolerance_overrides=options.tolerances,  # over the judged precision's (core.validate)
        label=f"engine {engine.id} ({model.name} {engine.backend} {engine.precision} {engine.targets})",
    )


def _default_profiles(engine: EngineRecord, model: ModelRecord) -> dict[str, Any]:
    """The shapes a test-load feeds an imported engine whose import named no profile: the model's
    default profile, as `build` would choose it (a built engine always records its own)."""
    if (engine.provenance or {}).get("kind") != "imported":
        return {}
    return resolve_profile(model_inputs(model)).to_dict()


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
        host_target=get_backend(engine.backend).host_target(host),
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
        details={**result.details, "inputs": result.inputs} if result.inputs else dict(result.details),
    )
