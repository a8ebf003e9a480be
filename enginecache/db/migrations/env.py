"""Alembic environment: runs on the connection the Catalog hands over (batch mode for SQLite)."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import enginecache.db.models  # noqa: F401  (registers the tables on SQLModel.metadata)

# Made by a migration and not declared on the tables (db.models, JobRecord: a partial index's dialect
# keywords would import every dialect they name): autogenerate must not propose dropping them.
MIGRATION_ONLY_INDEXES = frozenset({"ux_jobs_active_key"})


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    return not (type_ == "index" and reflected and name in MIGRATION_ONLY_INDEXES)


connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through db.catalog.Catalog.migrate()")
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
    include_object=include_object,
)
context.run_migrations()
