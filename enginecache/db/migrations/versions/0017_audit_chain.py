"""audit_events hash chain: prev_id, prev_hash and row_hash on each row, and the chain's head

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04

Each audit row names the row before it (`prev_id`), that row's hash (`prev_hash`) and carries its own
(`row_hash`), as `db.auditchain` defines them; `audit_chain_head` (one row) names the chain's last row
and hash, and is the lock concurrent writers queue on. `enginecache audit verify` walks the chain.

Rows written before this migration are chained here in id order, so an upgraded catalog verifies.
Chaining them is an UPDATE, which migration 0010's triggers refuse: they are off while it runs (SQLite:
dropped and created again as 0010 made them; PostgreSQL: disabled, then enabled), inside the
migration's transaction. `prev_hash` and `row_hash` are NOT NULL once filled (SQLite: batch mode copies
the table, dropping its triggers, which are created again), so a writer that skips the chain fails.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from enginecache.db.auditchain import GENESIS, HEAD_ID, HEAD_TABLE, row_hash
from enginecache.db.auditverify import PG_TRIGGERS, SQLITE_TRIGGERS

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

BATCH = 1000
HASH_COLUMNS = ("prev_hash", "row_hash")


def _sqlite() -> bool:
    return bool(op.get_bind().dialect.name == "sqlite")


def _triggers_off() -> None:
    if _sqlite():
        for name in SQLITE_TRIGGERS:
            op.execute(f"DROP TRIGGER IF EXISTS {name}")
    else:
        for name in PG_TRIGGERS:
            op.execute(f"ALTER TABLE audit_events DISABLE TRIGGER {name}")


def _triggers_on() -> None:
    if _sqlite():
        for sql in SQLITE_TRIGGERS.values():
            op.execute(sql)
    else:
        for name in PG_TRIGGERS:
            op.execute(f"ALTER TABLE audit_events ENABLE TRIGGER {name}")


def _chain_existing_rows() -> tuple[int | None, str]:
    """Chain every row in id order; the last row's id and hash (None and GENESIS: no rows)."""
    bind = op.get_bind()
    select = sa.text(
        "SELECT id, at, actor, origin, action, target, details FROM audit_events WHERE id > :after ORDER BY id "
        "LIMIT :limit"
    )
    update = sa.text(
        "UPDATE audit_events SET prev_id = :prev_id, prev_hash = :prev_hash, row_hash = :hash WHERE id = :id"
    )
    prev_id: int | None = None
    prev_hash = GENESIS
    while True:
        rows = list(bind.execute(select, {"after": prev_id or 0, "limit": BATCH}))
        for row_id, at, actor, origin, action, target, details in rows:
            digest = row_hash(prev_id, prev_hash, at, actor, origin, action, target, details)
            bind.execute(update, {"prev_id": prev_id, "prev_hash": prev_hash, "hash": digest, "id": row_id})
            prev_id, prev_hash = int(row_id), digest
        if len(rows) < BATCH:
            return prev_id, prev_hash


def upgrade() -> None:
    op.add_column("audit_events", sa.Column("prev_id", sa.Integer(), nullable=True))
    for name in HASH_COLUMNS:
        op.add_column("audit_events", sa.Column(name, sa.String(64), nullable=True))
    op.create_table(
        HEAD_TABLE,
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("last_id", sa.Integer(), nullable=True),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.CheckConstraint(f"id = {HEAD_ID}", name="ck_audit_chain_head_one_row"),
    )
    _triggers_off()
    last_id, last_hash = _chain_existing_rows()
    if _sqlite():
        with op.batch_alter_table("audit_events") as batch:
            for name in HASH_COLUMNS:
                batch.alter_column(name, existing_type=sa.String(64), nullable=False)
    else:
        for name in HASH_COLUMNS:
            op.alter_column("audit_events", name, existing_type=sa.String(64), nullable=False)
    _triggers_on()
    op.get_bind().execute(
        sa.text(f"INSERT INTO {HEAD_TABLE} (id, last_id, last_hash) VALUES (:id, :last_id, :last_hash)"),
        {"id": HEAD_ID, "last_id": last_id, "last_hash": last_hash},
    )


def downgrade() -> None:
    op.drop_table(HEAD_TABLE)
    if _sqlite():
        _triggers_off()
        with op.batch_alter_table("audit_events") as batch:
            for name in ("row_hash", "prev_hash", "prev_id"):
                batch.drop_column(name)
        _triggers_on()
    else:
        for name in ("row_hash", "prev_hash", "prev_id"):
            op.drop_column("audit_events", name)
