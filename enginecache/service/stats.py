"""Read models for the dashboard: counts, aggregates and pages computed in SQL.

Every function here answers with a bounded result (GROUP BY or LIMIT), so a catalog with 10,000
engines and 100,000 jobs never ships its rows to the browser. Timestamps are UTC.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlmodel import col, select

from enginecache.core.cachekey import INGREDIENTS
from enginecache.db.models import (
    EngineRecord,
    EngineStatus,
    JobRecord,
    JobStatus,
    LoadEventRecord,
    ModelRecord,
    WorkerRecord,
    utcnow,
)
from enginecache.errors import NotFoundError
from enginecache.service.context import AppContext
from enginecache.service.routing import WORKER_ALIVE_SECONDS

logger = logging.getLogger(__name__)

FAILED_JOB_STATUSES = (JobStatus.FAILED, JobStatus.DEAD)
ENGINE_PAGE_MAX = 500


# -- overview -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CatalogCounts:
    models: int
    source_models: int
    engines_by_status: dict[str, int]
    jobs_by_status: dict[str, int]
    workers_online: int
    workers_total: int

    @property
    def engines(self) -> int:
        return sum(self.engines_by_status.values())

    @property
    def jobs(self) -> int:
        return sum(self.jobs_by_status.values())


def catalog_counts(app: AppContext) -> CatalogCounts:
    """Models, engines by status, jobs by status, workers online: five small aggregate queries."""
    alive_since = utcnow() - timedelta(seconds=WORKER_ALIVE_SECONDS)
    with app.catalog.read() as session:
        models = session.execute(sa.select(sa.func.count()).select_from(ModelRecord)).scalar_one()
        sources = session.execute(
            sa.select(sa.func.count()).select_from(ModelRecord).where(col(ModelRecord.parent_id).is_(None))
        ).scalar_one()
        engines = session.execute(
            sa.select(col(EngineRecord.status), sa.func.count()).group_by(col(EngineRecord.status))
        ).all()
        jobs = session.execute(sa.select(col(JobRecord.status), sa.func.count()).group_by(col(JobRecord.status))).all()
        online = session.execute(
            sa.select(sa.func.count())
            .select_from(WorkerRecord)
            .where(col(WorkerRecord.heartbeat_at) >= alive_since, col(WorkerRecord.status) == "online")
        ).scalar_one()
        workers = session.execute(sa.select(sa.func.count()).select_from(WorkerRecord)).scalar_one()
    return CatalogCounts(
        models=int(models),
        source_models=int(sources),
        engines_by_status={str(s): int(n) for s, n in engines},
        jobs_by_status={str(s): int(n) for s, n in jobs},
        workers_online=int(online),
        workers_total=int(workers),
    )


@dataclass(frozen=True)
class CacheDay:
    """One day of cache activity: builds run (misses) and jobs served by an existing engine (hits)."""

    day: str
    misses: int
    hits: int


def _day(column: Any) -> Any:
    return sa.func.date(column)


def _day_text(value: Any) -> str:
    return value.isoformat() if isinstance(value, date) else str(value)


def cache_activity(app: AppContext, *, days: int = 30) -> list[CacheDay]:
    """Per day: engines built (a miss each; failed and unpublished attempts are not counted); hits
    are build requests answered from the cache at submission (load events of source
    "build_request") plus build jobs that ended with an engine another job had built (a hit found
    at claim time)."""
    since = utcnow() - timedelta(days=days)
    with app.catalog.read() as session:
        miss_day = _day(col(EngineRecord.created_at))
        misses = session.execute(
            sa.select(miss_day, sa.func.count())
            .where(
                col(EngineRecord.created_at) >= since,
                col(EngineRecord.status).in_((EngineStatus.READY, EngineStatus.CORRUPT, EngineStatus.RETIRED)),
            )
            .group_by(miss_day)
        ).all()
        hit_day = _day(col(JobRecord.finished_at))
        hits = session.execute(
            sa.select(hit_day, sa.func.count())
            .select_from(JobRecord)
            .join(EngineRecord, col(EngineRecord.id) == col(JobRecord.result_engine_id))
            .where(
                col(JobRecord.finished_at) >= since,
                col(JobRecord.kind) == "build",
                col(JobRecord.status) == JobStatus.SUCCEEDED,
                sa.or_(col(EngineRecord.job_id).is_(None), col(EngineRecord.job_id) != col(JobRecord.id)),
            )
            .group_by(hit_day)
        ).all()
        request_day = _day(col(LoadEventRecord.created_at))
        request_hits = session.execute(
            sa.select(request_day, sa.func.count())
            .where(
                col(LoadEventRecord.created_at) >= since,
                col(LoadEventRecord.source) == "build_request",
                col(LoadEventRecord.outcome) == "hit",
            )
            .group_by(request_day)
        ).all()
    by_day: dict[str, list[int]] = {}
    for day, n in request_hits:
        by_day.setdefault(_day_text(day), [0, 0])[1] += int(n)
    for day, n in misses:
        by_day.setdefault(_day_text(day), [0, 0])[0] = int(n)
    for day, n in hits:
        by_day.setdefault(_day_text(day), [0, 0])[1] += int(n)
    return [CacheDay(day, m, h) for day, (m, h) in sorted(by_day.items())]


@dataclass(frozen=True)
class Failure:
    source: str  # "job" | "engine"
    id: int
    when: datetime | None
    status: str
    what: str
    reason: str


def recent_failures(app: AppContext, *, limit: int = 20) -> list[Failure]:
    """The newest failed or dead jobs and failed or corrupt engines, with their reasons."""
    with app.catalog.read() as session:
        jobs = session.execute(
            sa.select(
                col(JobRecord.id),
                col(JobRecord.kind),
                col(JobRecord.status),
                col(JobRecord.error),
                col(JobRecord.finished_at),
                col(JobRecord.payload),
            )
            .where(col(JobRecord.status).in_(FAILED_JOB_STATUSES))
            .order_by(col(JobRecord.finished_at).desc())
            .limit(limit)
        ).all()
        engines = session.execute(
            sa.select(
                col(EngineRecord.id),
                col(EngineRecord.status),
                col(EngineRecord.error),
                col(EngineRecord.finished_at),
                col(EngineRecord.created_at),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(ModelRecord.name),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(col(EngineRecord.status).in_((EngineStatus.FAILED, EngineStatus.CORRUPT)))
            .order_by(col(EngineRecord.created_at).desc())
            .limit(limit)
        ).all()
    failures = [
        Failure(
            "job",
            int(j.id),
            j.finished_at,
            str(j.status),
            f"{j.kind} {_describe_payload(j.payload)}".strip(),
            j.error or "no reason recorded",
        )
        for j in jobs
    ]
    failures += [
        Failure(
            "engine",
            int(e.id),
            e.finished_at or e.created_at,
            str(e.status),
            f"{e.name} {e.backend} {e.precision} {e.targets}",
            e.error or ("blob does not match its sha256" if e.status == EngineStatus.CORRUPT else "no reason recorded"),
        )
        for e in engines
    ]
    epoch = datetime.min.replace(tzinfo=UTC)
    failures.sort(key=lambda f: f.when or epoch, reverse=True)
    return failures[:limit]


def _describe_payload(payload: Mapping[str, Any] | None) -> str:
    if not payload:
        return ""
    parts = [f"model {payload.get('model')}"] if payload.get("model") else []
    parts += [str(payload[k]) for k in ("backend", "precision") if payload.get(k)]
    if payload.get("targets"):
        parts.append(",".join(str(t) for t in payload["targets"]))
    if payload.get("engine_id"):
        parts.append(f"engine {payload['engine_id']}")
    return " ".join(parts)


# -- engines --------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineFilter:
    model_id: int | None = None
    backend: str | None = None
    precision: str | None = None
    status: str | None = None
    target: str | None = None  # one compute capability or CPU target contained in `targets`
    since: datetime | None = None
    until: datetime | None = None


@dataclass(frozen=True)
class EngineRow:
    id: int
    model: str
    model_id: int
    backend: str
    precision: str
    targets: str
    status: str
    size_bytes: int | None
    build_seconds: float | None
    sha256: str | None
    created_at: datetime


@dataclass(frozen=True)
class EnginePage:
    rows: list[EngineRow]
    total: int
    offset: int
    limit: int


def _engine_where(spec: EngineFilter) -> list[Any]:
    where: list[Any] = []
    if spec.model_id is not None:
        where.append(col(EngineRecord.model_id) == spec.model_id)
    if spec.backend:
        where.append(col(EngineRecord.backend) == spec.backend)
    if spec.precision:
        where.append(col(EngineRecord.precision) == spec.precision)
    if spec.status:
        where.append(col(EngineRecord.status) == spec.status.upper())
    if spec.target:
        target = spec.target.strip().lower()
        # targets is comma-joined: match a whole item, not a prefix of another (sm8 vs sm86)
        where.append(
            sa.or_(
                col(EngineRecord.targets) == target,
                col(EngineRecord.targets).startswith(target + ","),
                col(EngineRecord.targets).endswith("," + target),
                col(EngineRecord.targets).contains("," + target + ","),
            )
        )
    if spec.since is not None:
        where.append(col(EngineRecord.created_at) >= spec.since)
    if spec.until is not None:
        where.append(col(EngineRecord.created_at) < spec.until)
    return where


def engine_page(app: AppContext, spec: EngineFilter, *, offset: int = 0, limit: int = 50) -> EnginePage:
    """One page of engines matching `spec`, newest first, and how many match in all."""
    limit = max(1, min(limit, ENGINE_PAGE_MAX))
    offset = max(0, offset)
    where = _engine_where(spec)
    with app.catalog.read() as session:
        total = session.execute(sa.select(sa.func.count()).select_from(EngineRecord).where(*where)).scalar_one()
        rows = session.execute(
            sa.select(
                col(EngineRecord.id),
                col(ModelRecord.name),
                col(EngineRecord.model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(EngineRecord.status),
                col(EngineRecord.size_bytes),
                col(EngineRecord.build_seconds),
                col(EngineRecord.sha256),
                col(EngineRecord.created_at),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(*where)
            .order_by(col(EngineRecord.created_at).desc(), col(EngineRecord.id).desc())
            .offset(offset)
            .limit(limit)
        ).all()
    return EnginePage(
        rows=[
            EngineRow(
                id=int(r[0]),
                model=str(r[1]),
                model_id=int(r[2]),
                backend=str(r[3]),
                precision=str(r[4]),
                targets=str(r[5]),
                status=str(r[6]),
                size_bytes=r[7],
                build_seconds=r[8],
                sha256=r[9],
                created_at=r[10],
            )
            for r in rows
        ],
        total=int(total),
        offset=offset,
        limit=limit,
    )


@dataclass(frozen=True)
class FilterOptions:
    models: list[tuple[int, str]]
    backends: list[str]
    precisions: list[str]
    statuses: list[str]
    targets: list[str]


def engine_filter_options(app: AppContext) -> FilterOptions:
    """The distinct values each engine filter can take (DISTINCT over indexed columns)."""
    with app.catalog.read() as session:
        models = session.execute(
            sa.select(col(ModelRecord.id), col(ModelRecord.name)).order_by(col(ModelRecord.name), col(ModelRecord.id))
        ).all()
        backends = session.execute(sa.select(col(EngineRecord.backend)).distinct()).scalars().all()
        precisions = session.execute(sa.select(col(EngineRecord.precision)).distinct()).scalars().all()
        statuses = session.execute(sa.select(col(EngineRecord.status)).distinct()).scalars().all()
        target_sets = session.execute(sa.select(col(EngineRecord.targets)).distinct()).scalars().all()
    targets = sorted({t for joined in target_sets for t in str(joined).split(",") if t})
    return FilterOptions(
        models=[(int(i), str(n)) for i, n in models],
        backends=sorted(str(b) for b in backends),
        precisions=sorted(str(p) for p in precisions),
        statuses=sorted(str(s) for s in statuses),
        targets=targets,
    )


def ingredient_rows(ingredients: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The cache-key ingredients in their display order (schema, digest, precision, ...)."""
    return [(name, ingredients.get(name)) for name in INGREDIENTS]


# -- models ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class LineageEngine:
    model_id: int
    backend: str
    precision: str
    targets: str
    status: str
    count: int
    newest_id: int


@dataclass(frozen=True)
class Lineage:
    source: ModelRecord
    variants: list[ModelRecord]
    engines: list[LineageEngine] = field(default_factory=list)


def model_lineage(app: AppContext, model_id: int) -> Lineage:
    """A source model, its converted variants, and its engines grouped by backend, precision,
    targets and status (engines built from a variant are counted under their source model)."""
    with app.catalog.read() as session:
        model = session.get(ModelRecord, model_id)
        if model is None:
            raise NotFoundError(f"no model with id {model_id} in the catalog")
        source = model
        while source.parent_id is not None:
            parent = session.get(ModelRecord, source.parent_id)
            if parent is None:
                break
            source = parent
        variants = list(
            session.exec(
                select(ModelRecord).where(ModelRecord.parent_id == source.id).order_by(col(ModelRecord.id))
            ).all()
        )
        groups = session.execute(
            sa.select(
                col(EngineRecord.variant_model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(EngineRecord.status),
                sa.func.count(),
                sa.func.max(col(EngineRecord.id)),
            )
            .where(col(EngineRecord.model_id) == source.id)
            .group_by(
                col(EngineRecord.variant_model_id),
                col(EngineRecord.backend),
                col(EngineRecord.precision),
                col(EngineRecord.targets),
                col(EngineRecord.status),
            )
            .order_by(col(EngineRecord.precision), col(EngineRecord.targets))
            .limit(200)
        ).all()
    engines = [
        LineageEngine(
            model_id=int(g[0]) if g[0] is not None else int(source.id or 0),
            backend=str(g[1]),
            precision=str(g[2]),
            targets=str(g[3]),
            status=str(g[4]),
            count=int(g[5]),
            newest_id=int(g[6]),
        )
        for g in groups
    ]
    return Lineage(source=source, variants=variants, engines=engines)


@dataclass(frozen=True)
class ModelRow:
    id: int
    name: str
    parent_id: int | None
    size_bytes: int
    digest: str
    created_at: datetime
    engines: int


def model_rows(app: AppContext, *, limit: int = 500) -> list[ModelRow]:
    """Models, newest first, with how many engines each has (one grouped query)."""
    engine_counts = (
        sa.select(col(EngineRecord.model_id).label("mid"), sa.func.count().label("n"))
        .group_by(col(EngineRecord.model_id))
        .subquery()
    )
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(
                col(ModelRecord.id),
                col(ModelRecord.name),
                col(ModelRecord.parent_id),
                col(ModelRecord.size_bytes),
                col(ModelRecord.digest),
                col(ModelRecord.created_at),
                sa.func.coalesce(engine_counts.c.n, 0),
            )
            .outerjoin(engine_counts, engine_counts.c.mid == col(ModelRecord.id))
            .order_by(col(ModelRecord.created_at).desc(), col(ModelRecord.id).desc())
            .limit(limit)
        ).all()
    return [ModelRow(int(r[0]), str(r[1]), r[2], int(r[3]), str(r[4]), r[5], int(r[6])) for r in rows]


# -- jobs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRow:
    id: int
    kind: str
    status: str
    progress: float
    phase: str | None
    worker: str | None
    attempts: int
    max_attempts: int
    error: str | None
    log_tail: str
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result_engine_id: int | None
    payload: dict[str, Any]
    requirements: dict[str, Any]


def _job_row(job: JobRecord) -> JobRow:
    return JobRow(
        id=job.id or 0,
        kind=job.kind,
        status=str(job.status),
        progress=float(job.progress),
        phase=job.phase,
        worker=job.lease_owner,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        error=job.error,
        log_tail=job.log_tail,
        cancel_requested=job.cancel_requested,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        result_engine_id=job.result_engine_id,
        payload=dict(job.payload),
        requirements=dict(job.requirements),
    )


def active_jobs(app: AppContext, *, limit: int = 50) -> list[JobRow]:
    """QUEUED and RUNNING jobs, oldest first (the order they run in)."""
    with app.catalog.read() as session:
        jobs = session.exec(
            select(JobRecord)
            .where(col(JobRecord.status).in_((JobStatus.QUEUED, JobStatus.RUNNING)))
            .order_by(col(JobRecord.id))
            .limit(limit)
        ).all()
    return [_job_row(j) for j in jobs]


def jobs_by_id(app: AppContext, job_ids: Sequence[int]) -> list[JobRow]:
    if not job_ids:
        return []
    with app.catalog.read() as session:
        jobs = session.exec(
            select(JobRecord).where(col(JobRecord.id).in_(list(job_ids))).order_by(col(JobRecord.id))
        ).all()
    return [_job_row(j) for j in jobs]


def recent_jobs(app: AppContext, *, limit: int = 20) -> list[JobRow]:
    with app.catalog.read() as session:
        jobs = session.exec(select(JobRecord).order_by(col(JobRecord.id).desc()).limit(limit)).all()
    return [_job_row(j) for j in jobs]


def active_jobs_by_key(app: AppContext, cache_keys: Sequence[str]) -> dict[str, JobRow]:
    """The QUEUED/RUNNING job for each of these cache keys, where one exists."""
    if not cache_keys:
        return {}
    with app.catalog.read() as session:
        jobs = session.exec(
            select(JobRecord).where(
                col(JobRecord.idempotency_key).in_(list(cache_keys)),
                col(JobRecord.status).in_((JobStatus.QUEUED, JobStatus.RUNNING)),
            )
        ).all()
    return {str(j.idempotency_key): _job_row(j) for j in jobs}


# -- timings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuildTimeGroup:
    model: str
    backend: str
    targets: str
    precision: str
    engines: int
    mean_seconds: float
    min_seconds: float
    max_seconds: float
    mean_size_bytes: float


def build_time_groups(app: AppContext, *, limit: int = 500) -> list[BuildTimeGroup]:
    """Build time (and engine size) per model x backend x targets x precision, over READY engines
    (and retired ones, which were built all the same)."""
    seconds = col(EngineRecord.build_seconds)
    with app.catalog.read() as session:
        rows = session.execute(
            sa.select(
                col(ModelRecord.name),
                col(EngineRecord.backend),
                col(EngineRecord.targets),
                col(EngineRecord.precision),
                sa.func.count(),
                sa.func.avg(seconds),
                sa.func.min(seconds),
                sa.func.max(seconds),
                sa.func.avg(col(EngineRecord.size_bytes)),
            )
            .join(ModelRecord, col(ModelRecord.id) == col(EngineRecord.model_id))
            .where(seconds.is_not(None), col(EngineRecord.status).in_((EngineStatus.READY, EngineStatus.RETIRED)))
            .group_by(
                col(ModelRecord.name), col(EngineRecord.backend), col(EngineRecord.targets), col(EngineRecord.precision)
            )
            .order_by(col(ModelRecord.name), col(EngineRecord.precision), col(EngineRecord.targets))
            .limit(limit)
        ).all()
    return [
        BuildTimeGroup(
            model=str(r[0]),
            backend=str(r[1]),
            targets=str(r[2]),
            precision=str(r[3]),
            engines=int(r[4]),
            mean_seconds=float(r[5] or 0.0),
            min_seconds=float(r[6] or 0.0),
            max_seconds=float(r[7] or 0.0),
            mean_size_bytes=float(r[8] or 0.0),
        )
        for r in rows
    ]


# -- hosts ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostRow:
    name: str
    hostname: str
    pid: int
    status: str
    online: bool
    heartbeat_at: datetime
    started_at: datetime
    current_job_id: int | None
    fingerprint: dict[str, Any]
    capabilities: dict[str, Any]

    @property
    def can_build(self) -> list[str]:
        """What this worker can build: TensorRT-RTX for any listed SM, TensorRT for its GPUs, ORT for its CPU."""
        caps = self.capabilities
        out: list[str] = []
        for backend in caps.get("backends", []):
            if backend == "rtx":
                out.append("rtx: any of sm75, sm80, sm86, sm89, sm120, sm121 (no GPU needed)")
            elif backend == "trt":
                gpus = [str(g.get("compute_capability")) for g in caps.get("gpus", [])]
                out.append("trt: " + (", ".join(gpus) if gpus else "nothing (no NVIDIA GPU)"))
            elif backend == "ort":
                out.append(f"ort: {caps.get('cpu_target')}")
        return out

    @property
    def can_load(self) -> list[str]:
        """What it can load: GPU engines for its GPUs' compute capabilities, ORT for its CPU."""
        caps = self.capabilities
        gpus = [str(g.get("compute_capability")) for g in caps.get("gpus", [])]
        out: list[str] = []
        for backend in caps.get("backends", []):
            if backend in ("rtx", "trt"):
                out.append(f"{backend}: " + (", ".join(gpus) if gpus else "nothing (no NVIDIA GPU)"))
            elif backend == "ort":
                out.append(f"ort: {caps.get('cpu_target')}")
        return out


def worker_hosts(app: AppContext, *, limit: int = 200) -> list[HostRow]:
    """Every worker the catalog knows, most recent heartbeat first."""
    alive_since = utcnow() - timedelta(seconds=WORKER_ALIVE_SECONDS)
    with app.catalog.read() as session:
        workers = session.exec(select(WorkerRecord).order_by(col(WorkerRecord.heartbeat_at).desc()).limit(limit)).all()
    return [
        HostRow(
            name=w.name,
            hostname=w.hostname,
            pid=w.pid,
            status=w.status,
            online=w.status == "online" and w.heartbeat_at >= alive_since,
            heartbeat_at=w.heartbeat_at,
            started_at=w.started_at,
            current_job_id=w.current_job_id,
            fingerprint=dict(w.fingerprint),
            capabilities=dict(w.capabilities),
        )
        for w in workers
    ]
