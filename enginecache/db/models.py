"""Catalog tables (SQLModel). No TensorRT, no core imports here.

JSON columns hold structured facts (inspection, key ingredients); every field a query filters
or sorts on has a column and an index of its own.
"""

from __future__ import annotations

from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

from enginecache.db.types import UTCDateTime


def utcnow() -> datetime:
    return datetime.now(UTC)


class EngineStatus(StrEnum):
    PENDING = "PENDING"
    READY = "READY"
    FAILED = "FAILED"
    CORRUPT = "CORRUPT"
    RETIRED = "RETIRED"
    UNPROVEN = "UNPROVEN"  # imported (`engine import`): no host has loaded it yet; lookups pass it by
    TAMPERED = "TAMPERED"  # its signed statement no longer matches its row (core.signing): never loaded


class ModelStatus(StrEnum):
    OK = "OK"
    CORRUPT = "CORRUPT"  # the stored bundle no longer hashes to the digest (re-add the original to repair)


def _json() -> Any:
    return Field(default_factory=dict, sa_column=sa.Column(sa.JSON, nullable=False))


def _tz_time(*, nullable: bool = False, index: bool = False) -> Any:
    return Field(
        default_factory=utcnow if not nullable else None,
        sa_column=sa.Column(UTCDateTime(), nullable=nullable, index=index),
    )


class ModelRecord(SQLModel, table=True):
    """An ONNX model (a user's upload or a precision-converted variant) in the store."""

    __tablename__ = "models"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    digest: str = Field(sa_column=sa.Column(sa.String(64), nullable=False, unique=True))
    filename: str
    store_path: str
    size_bytes: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    info: dict[str, Any] = _json()
    parent_id: int | None = Field(default=None, foreign_key="models.id", index=True)
    recipe: dict[str, Any] = _json()
    recipe_key: str | None = Field(default=None, index=True)
    created_at: datetime = _tz_time()
    # ModelStatus (migration 0009): CORRUPT once `verify` or a build found the stored bundle changed
    status: str = Field(
        default=ModelStatus.OK,
        sa_column=sa.Column(sa.String(), nullable=False, default=ModelStatus.OK.value, server_default="OK"),
    )


class EngineRecord(SQLModel, table=True):
    """One engine build: its request (cache key and ingredients) and, once READY, its blob."""

    __tablename__ = "engines"
    __table_args__ = (
        sa.Index("ix_engines_model_created", "model_id", "created_at"),
        sa.Index("ix_engines_key_status", "cache_key", "status"),
        sa.Index("ix_engines_status_created", "status", "created_at"),
        sa.Index("ix_engines_model_backend_precision", "model_id", "backend", "precision", "targets"),
        # Timings' build-time groups read only this index, in group order (migration 0008)
        sa.Index(
            "ix_engines_build_groups",
            "model_id",
            "backend",
            "targets",
            "precision",
            "status",
            "build_seconds",
            "size_bytes",
        ),
        # Overview's build jobs answered by another job's engine: an index-only anti-join (migration 0008)
        sa.Index("ix_engines_job_engine", "job_id", "id"),
        # Models' engine counts per source model and per variant, each from its index alone (migration 0014)
        sa.Index("ix_engines_model_variant", "model_id", "variant_model_id"),
        sa.Index("ix_engines_variant", "variant_model_id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    model_id: int = Field(foreign_key="models.id")
    variant_model_id: int | None = Field(default=None, foreign_key="models.id")
    backend: str = Field(index=True)
    backend_version: str
    precision: str = Field(index=True)
    targets: str = Field(index=True)  # comma-joined, sorted: "sm80,sm86"
    cache_key: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    status: str = Field(default=EngineStatus.PENDING, index=True)
    onnx_digest: str
    key_ingredients: dict[str, Any] = _json()
    precision_recipe: dict[str, Any] = _json()
    build_options: dict[str, Any] = _json()
    target_info: dict[str, Any] = _json()
    os: str
    host: dict[str, Any] = _json()
    io: list[dict[str, Any]] = Field(default_factory=list, sa_column=sa.Column(sa.JSON, nullable=False))
    warnings: list[str] = Field(default_factory=list, sa_column=sa.Column(sa.JSON, nullable=False))
    sha256: str | None = Field(default=None, index=True)
    blake3: str | None = None
    header_blake3: str | None = None  # BLAKE3 of the blob's first 4096 bytes: a load checks the header on them first
    # BLAKE3 of each chunk (core.chunkdigests' encoding): a load verifies chunks on every core as they land
    chunk_blake3: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    size_bytes: int | None = Field(default=None, sa_column=sa.Column(sa.BigInteger, nullable=True))
    blob_path: str | None = None
    build_seconds: float | None = None
    builder_log: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False))
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    created_at: datetime = _tz_time(index=True)
    finished_at: datetime | None = _tz_time(nullable=True)
    verified_at: datetime | None = _tz_time(nullable=True)
    retired_at: datetime | None = _tz_time(nullable=True)  # when it was RETIRED: gc's grace counts from it
    job_id: int | None = Field(default=None, index=True)
    job_attempt: int | None = None
    # Where the engine came from (migration 0018): {} for one built here; an imported one's
    # {"kind": "imported", "by", "origin", "source", "declared", "header", "unknown", "proven"?}
    provenance: dict[str, Any] = Field(
        default_factory=dict, sa_column=sa.Column(sa.JSON, nullable=False, server_default="{}")
    )
    # Signed provenance (migration 0019, core.signing): the statement's exact text and its Ed25519
    # signature `ed25519:<key id>:<base64>`; None: unsigned
    signed_statement: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    signature: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    # The remote store's copy (migration 0020): when `verify --remote` last re-hashed it, and what it
    # found (None: the object is the blob; else the reason, naming the key and the chunk)
    remote_verified_at: datetime | None = _tz_time(nullable=True)
    remote_problem: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))


class JobStatus(StrEnum):
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # deterministic failure: not retried
    DEAD = "DEAD"  # attempts exhausted
    CANCELLED = "CANCELLED"


ACTIVE_JOB_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
TERMINAL_JOB_STATUSES = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.DEAD, JobStatus.CANCELLED)


class JobRecord(SQLModel, table=True):
    """A unit of work (build, test_load) claimed by one worker at a time under a lease."""

    __tablename__ = "jobs"
    __table_args__ = (
        sa.Index("ix_jobs_status_run_after", "status", "run_after"),
        sa.Index("ix_jobs_status_created", "status", "created_at"),
        sa.Index("ix_jobs_finished_at", "finished_at"),
        # Overview's build-job hits per day (migration 0008)
        sa.Index("ix_jobs_kind_status_finished", "kind", "status", "finished_at", "result_engine_id"),
        # Not declared here: `ux_jobs_active_key`, unique on idempotency_key among QUEUED and RUNNING
        # jobs (migration 0002 makes it; tests/test_catalog_schema.py checks it on both databases). A
        # partial index needs a dialect's `*_where` keyword, and SQLAlchemy imports each dialect a keyword
        # names to validate it: PostgreSQL's on every import of this module, which SQLite users never need.
    )

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(index=True)
    status: str = Field(default=JobStatus.QUEUED)
    idempotency_key: str | None = None
    payload: dict[str, Any] = _json()
    requirements: dict[str, Any] = _json()
    attempts: int = 0
    max_attempts: int = 3
    timeout_seconds: float = 3600.0
    lease_owner: str | None = None
    runner_pid: int | None = None  # the child process running the current attempt
    lease_token: str | None = None
    lease_expires_at: datetime | None = _tz_time(nullable=True)
    cancel_requested: bool = False
    progress: float = 0.0
    phase: str | None = None
    log_tail: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False))
    error: str | None = Field(default=None, sa_column=sa.Column(sa.Text, nullable=True))
    result_engine_id: int | None = Field(default=None, foreign_key="engines.id")
    # Who submitted it (the actor's name, `service.access.audit`; migration 0022): the worker records
    # the job's changes as theirs. NULL for jobs from before.
    submitted_by: str | None = None
    run_after: datetime = _tz_time()
    created_at: datetime = _tz_time(index=True)
    started_at: datetime | None = _tz_time(nullable=True)
    finished_at: datetime | None = _tz_time(nullable=True)
    updated_at: datetime = _tz_time()


class WorkerRecord(SQLModel, table=True):
    """A worker process: its host fingerprint, what it can run, and its last heartbeat."""

    __tablename__ = "workers"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(sa_column=sa.Column(sa.String, nullable=False, unique=True))
    hostname: str
    pid: int
    fingerprint: dict[str, Any] = _json()
    capabilities: dict[str, Any] = _json()
    status: str = "online"
    current_job_id: int | None = None
    started_at: datetime = _tz_time()
    heartbeat_at: datetime = _tz_time(index=True)


class LoadRunRecord(SQLModel, table=True):
    """One test-load of an engine: verdict, seconds per load phase, latency, accuracy per output."""

    __tablename__ = "load_runs"
    __table_args__ = (
        sa.Index("ix_load_runs_engine_created", "engine_id", "created_at"),
        sa.Index("ix_load_runs_model_backend_precision", "model_id", "backend", "precision", "targets"),
    )

    id: int | None = Field(default=None, primary_key=True)
    engine_id: int = Field(foreign_key="engines.id")
    model_id: int = Field(foreign_key="models.id")
    job_id: int | None = Field(default=None, foreign_key="jobs.id")
    backend: str
    precision: str
    targets: str
    hostname: str = Field(index=True)
    host_target: str  # this host's GPU compute capability or CPU target
    verdict: str = Field(index=True)  # PASS | FAIL | INCOMPATIBLE | CORRUPT | ERROR
    reason: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False))
    # Seconds per load phase, each its own column so the Timings view aggregates in SQL.
    read_verify_s: float | None = None
    validity_s: float | None = None
    deserialize_s: float | None = None
    create_context_s: float | None = None
    allocate_io_s: float | None = None
    first_inference_s: float | None = None
    load_s: float | None = None
    iterations: int = 0
    batch: int | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p99_ms: float | None = None
    mean_ms: float | None = None
    throughput: float | None = None
    samples_ms: list[float] = Field(default_factory=list, sa_column=sa.Column(sa.JSON, nullable=False))
    accuracy: list[dict[str, Any]] = Field(default_factory=list, sa_column=sa.Column(sa.JSON, nullable=False))
    tolerances: dict[str, Any] = _json()
    input_shapes: dict[str, Any] = _json()
    details: dict[str, Any] = _json()
    created_at: datetime = _tz_time(index=True)


class StatCacheRecord(SQLModel, table=True):
    """An ONNX digest keyed by its files' stat (git's index idea): a hit costs O(1) in the model's size.

    One row per (host, path); `files` holds (name, size, mtime_ns, ctime_ns, inode) of the model and
    each external data file. Any change of any of them means re-hash. `racy` marks an entry hashed
    within the filesystem's timestamp granularity of its mtime: it is re-hashed, never trusted.
    """

    __tablename__ = "onnx_stat_cache"
    __table_args__ = (sa.UniqueConstraint("hostname", "path", name="ux_onnx_stat_cache_host_path"),)

    id: int | None = Field(default=None, primary_key=True)
    hostname: str
    path: str
    size_bytes: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    mtime_ns: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    inode: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    files: list[list[Any]] = Field(default_factory=list, sa_column=sa.Column(sa.JSON, nullable=False))
    digest: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    racy: bool = False
    hashed_at: datetime = _tz_time()


class LoadEventRecord(SQLModel, table=True):
    """One cache lookup: a serving process's `load_or_build` call (source "load_or_build": hit | miss |
    built | queued | rejected, with seconds per phase), or a build request (source "build_request":
    hit | queued | joined)."""

    __tablename__ = "load_events"
    __table_args__ = (
        sa.Index("ix_load_events_model_host_created", "model_name", "hostname", "created_at"),
        sa.Index("ix_load_events_outcome_created", "outcome", "created_at"),
        # Overview's lookups and hits per day, Timings' hit rates per model and host (migration 0008)
        sa.Index("ix_load_events_source_created", "source", "created_at"),
        sa.Index("ix_load_events_source_outcome_created", "source", "outcome", "created_at"),
        sa.Index(
            "ix_load_events_model_host_source",
            "model_name",
            "hostname",
            "source",
            "created_at",
            "outcome",
            "total_s",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    hostname: str
    model_name: str
    model_id: int | None = Field(default=None, foreign_key="models.id")
    engine_id: int | None = Field(default=None, foreign_key="engines.id")
    backend: str
    precision: str
    host_target: str
    outcome: str
    source: str = Field(default="load_or_build", index=True)
    reason: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False))
    lookup_s: float | None = None  # fingerprint (stat cache) + catalog
    read_verify_s: float | None = None
    load_s: float | None = None  # validity + deserialize + context + I/O
    build_s: float | None = None
    total_s: float = 0.0
    stat_cache_hit: bool | None = None
    phases: dict[str, Any] = _json()
    created_at: datetime = _tz_time(index=True)


class EngineMemoRecord(SQLModel, table=True):
    """A serving lookup's answer, remembered (`enginecache.service.serving.memo`): the engine `load_or_build`
    found for one request (the model digest, the RuntimeSpec, the backend and precision-tool
    versions, the host facts and the code that planned it, all in `memo_key`) and the model's READY
    engines at the time. The stdlib cache hit (`service.serving.hitpath`) serves it only while that set of
    READY engines is unchanged and the engine is still READY; anything else is a miss of the memo,
    answered by the full lookup, which writes the memo anew."""

    __tablename__ = "engine_memos"
    __table_args__ = (sa.UniqueConstraint("memo_key", name="ux_engine_memos_key"),)

    id: int | None = Field(default=None, primary_key=True)
    memo_key: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    model_id: int = Field(foreign_key="models.id", index=True)
    engine_id: int = Field(foreign_key="engines.id", index=True)
    cache_key: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))
    ready_engines: str = Field(sa_column=sa.Column(sa.Text, nullable=False))  # "1,4,7": ids in order
    host_target: str
    hostname: str
    request: dict[str, Any] = _json()
    created_at: datetime = _tz_time()


class AuditEventRecord(SQLModel, table=True):
    """One change, as `service.access.audit.record` wrote it right after the change succeeded: when (`at`),
    who (`actor`: an OS user or a dashboard login), from where (`origin`: `cli <host> pid <pid>`,
    `dashboard <client address>`), what (`action`, `target`, `details`).

    Append-only: the database refuses UPDATE and DELETE of its rows (and TRUNCATE on PostgreSQL), by
    the triggers of migration 0010. Hash-chained (migration 0017): `prev_id` and `prev_hash` name the
    row before it in the chain, `row_hash` is its own; only `db.auditchain.append` writes a row."""

    __tablename__ = "audit_events"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = _tz_time(index=True)
    actor: str
    origin: str
    action: str = Field(index=True)
    target: str
    details: dict[str, Any] = _json()
    prev_id: int | None = None
    prev_hash: str = Field(default="", sa_column=sa.Column(sa.String(64), nullable=False))
    row_hash: str = Field(default="", sa_column=sa.Column(sa.String(64), nullable=False))


class AuditChainHeadRecord(SQLModel, table=True):
    """The audit chain's head (migration 0017): its one row (`id` 1) names the chain's last row and
    that row's hash (None and 64 zeros: an empty log). `db.auditchain.append` locks and moves it."""

    __tablename__ = "audit_chain_head"
    __table_args__ = (sa.CheckConstraint("id = 1", name="ck_audit_chain_head_one_row"),)

    id: int = Field(primary_key=True)
    last_id: int | None = None
    last_hash: str = Field(sa_column=sa.Column(sa.String(64), nullable=False))


class UserRoleRecord(SQLModel, table=True):
    """A dashboard user's role (`service.access.roles.Role`: viewer, operator, admin), by `subject`: the
    login's e-mail, lowercased. A user without a row is denied everything (deny by default); the
    CLI and the processes of this machine act as the local admin and need none. `granted_by` names
    the actor who set the role last, `granted_at` when."""

    __tablename__ = "user_roles"
    __table_args__ = (sa.CheckConstraint("role IN ('viewer', 'operator', 'admin')", name="ck_user_roles_role"),)

    subject: str = Field(primary_key=True)
    role: str
    granted_by: str
    granted_at: datetime = _tz_time()


class AliasMoveRecord(SQLModel, table=True):
    """One move of a release alias (migration 0013): `promote` points `alias` of model `name` (for
    every host, or for the GPU class `gpu_class`, e.g. "sm86") at the version `model_id`; `rollback`
    takes the last promote back. Rows are only ever added; `service.models.releases` replays them."""

    __tablename__ = "alias_moves"
    __table_args__ = (
        sa.CheckConstraint("action IN ('promote', 'rollback')", name="ck_alias_moves_action"),
        sa.Index("ix_alias_moves_name_alias", "name", "alias", "gpu_class", "id"),
    )

    id: int | None = Field(default=None, primary_key=True)
    name: str
    alias: str
    gpu_class: str = ""  # "" for every host
    action: str
    model_id: int | None = Field(default=None, foreign_key="models.id")
    actor: str
    at: datetime = _tz_time()


class RuntimeCacheRecord(SQLModel, table=True):
    """A TensorRT-RTX runtime cache a serving process published (migration 0021): the kernels it
    compiled for one GPU, keyed by (engine sha256, GPU SKU, compute capability, TensorRT-RTX
    version, CUDA version). Its bytes are a blob in the store; which one a host may use is
    `core.runtimecache`'s rule. Rows are only added (a re-publish of the same bytes under the same key
    adds none)."""

    __tablename__ = "runtime_caches"
    __table_args__ = (
        sa.Index("ix_runtime_caches_engine_sm", "engine_id", "compute_capability", "created_at"),
        sa.UniqueConstraint(
            "engine_id",
            "gpu_sku",
            "compute_capability",
            "rtx_version",
            "cuda_version",
            "sha256",
            name="uq_runtime_caches_key_blob",
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    engine_id: int = Field(foreign_key="engines.id")
    engine_sha256: str
    gpu_sku: str  # the GPU's name as NVML reports it ("NVIDIA GeForce RTX 4090")
    compute_capability: str  # "sm89"
    rtx_version: str  # the TensorRT-RTX that wrote it ("1.7.1.116")
    cuda_version: str  # the CUDA driver version it ran under ("12.9")
    sha256: str
    blake3: str
    chunk_blake3: str = Field(default="", sa_column=sa.Column(sa.Text, nullable=False, server_default=""))
    size_bytes: int = Field(sa_column=sa.Column(sa.BigInteger, nullable=False))
    created_at: datetime = _tz_time()
    actor: str
    host: str
