"""Cache lookup events (serving processes' load_or_build calls and build requests) for the charts,
written by `db.engines.record_load_event`, the one writer of a load event."""

from __future__ import annotations

import logging

import sqlalchemy as sa

from enginecache.db import engines
from enginecache.db.models import LoadEventRecord
from enginecache.service.context import AppContext

logger = logging.getLogger(__name__)


def record_event(app: AppContext, event: LoadEventRecord) -> None:
    """Events feed charts; a catalog that refuses the write must not stop a build or a service start."""
    try:
        with app.catalog.changes() as ex:
            engines.record_load_event(ex, {name: getattr(event, name) for name in engines.LOAD_EVENT_COLUMNS})
    except sa.exc.SQLAlchemyError as err:
        logger.warning("cache event not recorded: %s", err)
