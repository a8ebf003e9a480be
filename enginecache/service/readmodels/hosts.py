"""Hosts' read models: every worker the catalog knows, and what each can build and load.

What a worker can build or load is each backend's own policy (`describe_buildable`,
`describe_loadable`), asked of the backends the worker advertised."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlmodel import col, select

from enginecache.core.backends.base import Backend
from enginecache.core.backends.registry import all_backends
from enginecache.db.models import WorkerRecord
from enginecache.service.context import AppContext
from enginecache.service.readmodels.liveness import ONLINE, alive_since


def _describe_per_backend(capabilities: Mapping[str, Any], describe: Callable[[Backend], str]) -> list[str]:
    """One line per backend the worker advertises, in its order; a backend this version does not
    know is named as such rather than dropped."""
    known = {backend.name: backend for backend in all_backends()}
    lines = []
    for name in capabilities.get("backends", []):
        backend = known.get(str(name))
        lines.append(describe(backend) if backend is not None else f"{name}: a backend this version does not know")
    return lines


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
        """What this worker can build, per backend (TensorRT-RTX: any of its compute capabilities)."""
        caps = self.capabilities
        return _describe_per_backend(caps, lambda backend: backend.describe_buildable(caps))

    @property
    def can_load(self) -> list[str]:
        """What it can load, per backend (GPU engines for its GPUs, ONNX Runtime for its CPU)."""
        caps = self.capabilities
        return _describe_per_backend(caps, lambda backend: backend.describe_loadable(caps))


def worker_hosts(app: AppContext, *, limit: int = 200) -> list[HostRow]:
    """Every worker the catalog knows, most recent heartbeat first."""
    since = alive_since()
    with app.catalog.read() as session:
        workers = session.exec(select(WorkerRecord).order_by(col(WorkerRecord.heartbeat_at).desc()).limit(limit)).all()
    return [
        HostRow(
            name=w.name,
            hostname=w.hostname,
            pid=w.pid,
            status=w.status,
            online=w.status == ONLINE and w.heartbeat_at >= since,
            heartbeat_at=w.heartbeat_at,
            started_at=w.started_at,
            current_job_id=w.current_job_id,
            fingerprint=dict(w.fingerprint),
            capabilities=dict(w.capabilities),
        )
        for w in workers
    ]
