"""The catalog's columns read or written without SQLAlchemy, and how each is stored: one table that the
stdlib reader (`db.reader`), the engine-lifecycle gateway (`db.engines`) and a cache hit's engine row
(`service.serving.hitpath`) decode and encode by. tests/test_catalog_open.py checks it against the
SQLModel tables.

A kind is "json" (JSON text), "time" (naive UTC text on SQLite, as `db.types.UTCDateTime` stores it; an
aware UTC datetime when read), "bool" (0/1 on SQLite) or "" (as stored).
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from datetime import datetime
    from typing import Any

# table -> column -> kind: "json" (decoded JSON), "time" (an aware UTC datetime), "bool", "" (as stored).
COLUMN_KINDS: dict[str, dict[str, str]] = {
    "models": {
        "id": "",
        "name": "",
        "digest": "",
        "filename": "",
        "store_path": "",
        "size_bytes": "",
        "info": "json",
        "parent_id": "",
        "recipe": "json",
        "created_at": "time",
    },
    "engines": {
        "id": "",
        "model_id": "",
        "variant_model_id": "",
        "backend": "",
        "backend_version": "",
        "precision": "",
        "targets": "",
        "cache_key": "",
        "status": "",
        "key_ingredients": "json",
        "precision_recipe": "json",
        "build_options": "json",
        "target_info": "json",
        "os": "",
        "host": "json",
        "io": "json",
        "warnings": "json",
        "sha256": "",
        "blake3": "",
        "header_blake3": "",
        "chunk_blake3": "",
        "size_bytes": "",
        "blob_path": "",
        "build_seconds": "",
        "builder_log": "",
        "error": "",
        "created_at": "time",
        "finished_at": "time",
        "verified_at": "time",
        "provenance": "json",
        "signed_statement": "",
        "signature": "",
        "remote_verified_at": "time",
        "remote_problem": "",
    },
    "jobs": {
        "id": "",
        "kind": "",
        "status": "",
        "payload": "json",
        "requirements": "json",
        "attempts": "",
        "max_attempts": "",
        "lease_owner": "",
        "runner_pid": "",
        "cancel_requested": "bool",
        "progress": "",
        "phase": "",
        "log_tail": "",
        "error": "",
        "result_engine_id": "",
        "created_at": "time",
        "started_at": "time",
        "finished_at": "time",
    },
    "workers": {"name": "", "status": "", "capabilities": "json", "heartbeat_at": "time"},
}


def decode_time(value: Any) -> datetime | None:
    if value is None:
        return None
    from datetime import UTC, datetime  # where a timestamp is read: a cache hit reads none

    parsed = value if isinstance(value, datetime) else datetime.fromisoformat(value)
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def decode_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def decode_bool(value: Any) -> bool | None:
    return None if value is None else bool(value)


DECODERS: dict[str, Callable[[Any], Any]] = {"json": decode_json, "time": decode_time, "bool": decode_bool}


def decode_row(table: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with each column of `table` that COLUMN_KINDS lists decoded by its kind (the others as
    stored)."""
    kinds = COLUMN_KINDS[table]
    return {name: DECODERS[kinds[name]](value) if kinds.get(name) else value for name, value in row.items()}
