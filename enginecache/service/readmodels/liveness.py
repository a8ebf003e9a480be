"""When a worker counts as online: status "online" and a heartbeat within WORKER_ALIVE_SECONDS."""

from __future__ import annotations

from datetime import datetime, timedelta

from enginecache.db.models import utcnow
from enginecache.service.jobs.routing import WORKER_ALIVE_SECONDS

ONLINE = "online"


def alive_since(now: datetime | None = None) -> datetime:
    """The oldest heartbeat of a worker still counted as live at `now` (default: the clock's now)."""
    return (now or utcnow()) - timedelta(seconds=WORKER_ALIVE_SECONDS)
