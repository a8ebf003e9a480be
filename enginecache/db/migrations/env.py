"""Alembic environment: runs on the connection the Catalog hands over (batch mode for SQLite)."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import enginecache.db.models  # noqa: F401  (registers the tables on SQLModel.metadata)

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through db.catalog.Catalog.migrate()")
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
context.run_migrations()
