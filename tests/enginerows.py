"""Engine rows made from an existing one, for tests of what reads the catalog only (a compatibility
rule, a selection, a blob shared by two rows): no build, no blob written."""

from __future__ import annotations

from typing import Any

from enginecache.db.models import EngineRecord
from enginecache.service.context import AppContext


def engine_row_like(app: AppContext, engine: EngineRecord, **changes: Any) -> EngineRecord:
    """Another engine row like `engine` with `changes` (its own cache key unless one is given)."""
    key = f"{sorted(changes.items())}".encode().hex()[:64].ljust(64, "0")
    row = EngineRecord.model_validate(engine.model_dump(exclude={"id"}) | {"cache_key": key, **changes})
    with app.catalog.write() as session:
        session.add(row)
        session.flush()
        session.refresh(row)
    return row
