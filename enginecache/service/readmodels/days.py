"""Days in the read models: a window's days in UTC, rows counted per day in SQL, a timestamp's UTC day."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import sqlalchemy as sa

from enginecache.db.models import utcnow
from enginecache.db.types import UTCDateTime

DayBounds = Sequence[tuple[date, datetime, datetime]]


def utc_day(column: Any, dialect: str) -> Any:
    """The UTC calendar day of a timestamp column, as SQL (SQLite keeps naive UTC text; PostgreSQL's
    date() of a timestamptz would take the session's time zone)."""
    return sa.func.date(column) if dialect == "sqlite" else sa.func.date(sa.func.timezone("UTC", column))


def day_bounds(days: int, *, now: datetime | None = None) -> list[tuple[date, datetime, datetime]]:
    """(day, its start, the next day's start) in UTC for today and the `days` days before it, oldest
    first; the first starts `days` days before now (a partial day), like a `created_at >= since` window."""
    now = now or utcnow()
    since = now - timedelta(days=days)
    first = since.date()
    out = []
    for offset in range((now.date() - first).days + 1):
        day = first + timedelta(days=offset)
        start = datetime.combine(day, time.min, tzinfo=UTC)
        out.append((day, max(start, since), start + timedelta(days=1)))
    return out


def counts_per_day(
    session: Any, column: Any, where: Sequence[Any], bounds: DayBounds, parts: Mapping[str, Any | None]
) -> dict[str, dict[date, int]]:
    """Rows matching `where` per day of `bounds` (by `column`, a timestamp), for each of `parts`
    (name -> an extra condition, or None for all): {part: {day: count}}, days without rows left out.

    One statement: the days as a VALUES list, and per day and part a correlated COUNT, each a range
    scan of an index that leads with the equality columns of `where` and the part's, then `column`
    (migration 0008): no table row is read and nothing is sorted. A GROUP BY date(column) over the
    window sorts every row of it on SQLite (several times slower); on PostgreSQL the two cost about
    the same. The statement's shape depends only on the number of days and parts, so SQLAlchemy
    compiles it once per process."""
    days = (
        sa.values(
            sa.column("n", sa.Integer), sa.column("start", UTCDateTime()), sa.column("stop", UTCDateTime()), name="days"
        )
        .data([(n, start, stop) for n, (_, start, stop) in enumerate(bounds)])
        .cte("days")
    )
    counts = [
        sa.select(sa.func.count())
        .select_from(column.table)
        .where(*where, *([extra] if extra is not None else []), column >= days.c.start, column < days.c.stop)
        .correlate(days)
        .scalar_subquery()
        for extra in parts.values()
    ]
    out: dict[str, dict[date, int]] = {name: {} for name in parts}
    for n, *values in session.execute(sa.select(days.c.n, *counts)).all():
        for name, count in zip(parts, values, strict=True):
            if count:
                out[name][bounds[int(n)][0]] = int(count)
    return out
