"""What the migrations make that the SQLModel tables do not declare: the partial unique index on an
active job's idempotency key (db.models, JobRecord), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from enginecache.db.models import JobRecord, JobStatus
from enginecache.service.context import AppContext
from tests.servingkit import loaded_modules


def _insert(app: AppContext, status: JobStatus) -> None:
    with app.catalog.write() as session:
        session.add(JobRecord(kind="build", status=status, idempotency_key="key-1"))


def test_one_active_job_per_idempotency_key_and_any_number_finished(catalog_ctx: AppContext) -> None:
    for _ in range(2):
        _insert(catalog_ctx, JobStatus.SUCCEEDED)
    _insert(catalog_ctx, JobStatus.QUEUED)
    for active in (JobStatus.QUEUED, JobStatus.RUNNING):
        with pytest.raises(sa.exc.IntegrityError):
            _insert(catalog_ctx, active)


def test_importing_the_tables_loads_no_postgresql_dialect() -> None:
    assert loaded_modules("import enginecache.db.models", "sqlalchemy.dialects.postgresql") == []
