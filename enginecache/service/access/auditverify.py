"""Use case: is the audit log whole? (`enginecache audit verify`, a restore, a worker's start.)

`verify_audit` walks the hash chain (`db.auditverify.walk_chain`) and checks the append-only
triggers (`db.auditverify.trigger_problems`) in one read transaction, one snapshot of the catalog
(PostgreSQL at REPEATABLE READ), so writers going on meanwhile break no link. It changes nothing.
`report_trigger_problems` is the check a long-running process makes when it starts: a trigger that
is missing or disabled is logged as an error (the process starts anyway; the chain still records
what follows, and `audit verify` names what was changed meanwhile).

What it promises: a row deleted, edited or inserted beside the chain, rows cut from its end, and a
trigger dropped or disabled are found. What it does not: someone who can write the catalog
(its owner) can rewrite the chain from some row on consistently, head included; that is found only
against a head kept elsewhere (`anchor`: a backup's manifest records one, docs/security.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from enginecache.db.auditverify import ChainReport, trigger_problems, walk_chain
from enginecache.db.catalog import Catalog
from enginecache.db.sqlexec import AlchemyExecutor
from enginecache.errors import BadInputError
from enginecache.service.context import AppContext

logger = logging.getLogger(__name__)

HASH_LENGTH = 64


@dataclass(frozen=True)
class AuditVerifyResult:
    """The chain's report, the triggers' problems (empty: all stand) and the anchor checked."""

    chain: ChainReport
    triggers: list[str]
    anchor: tuple[int, str] | None = None

    @property
    def ok(self) -> bool:
        return self.chain.broken is None and not self.triggers

    def problems(self) -> list[str]:
        """Each finding, one sentence each: the chain's first break, then the triggers'."""
        broken = self.chain.broken
        return ([f"audit chain broken: {broken.message}"] if broken else []) + [
            f"audit log not protected: {problem}" for problem in self.triggers
        ]

    def to_dict(self) -> dict[str, Any]:
        """`enginecache audit verify --json`'s document."""
        return {
            "ok": self.ok,
            **self.chain.to_dict(),
            "anchor": {"id": self.anchor[0], "hash": self.anchor[1]} if self.anchor else None,
            "triggers": {"ok": not self.triggers, "problems": self.triggers},
            "problems": self.problems(),
        }


def parse_anchor(text: str) -> tuple[int, str]:
    """`ID:HASH` (a head kept elsewhere: a row id and its sha256 hex) as a pair; BadInputError
    saying what is wrong."""
    row, _, digest = text.partition(":")
    digest = digest.strip().lower()
    if not row.strip().isdigit() or len(digest) != HASH_LENGTH or any(c not in "0123456789abcdef" for c in digest):
        raise BadInputError(f"--head {text!r}: expected ID:HASH, a row id and its 64-hex-digit hash")
    return int(row), digest


def verify_catalog(catalog: Catalog, *, anchor: tuple[int, str] | None = None) -> AuditVerifyResult:
    """Walk the chain and check the triggers of `catalog`, in one snapshot."""
    with catalog.connect() as connection:
        if not catalog.is_sqlite:
            connection.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)
        with connection.begin():
            ex = AlchemyExecutor(connection)
            chain = walk_chain(ex, sqlite=catalog.is_sqlite, anchor=anchor)
            triggers = trigger_problems(ex, sqlite=catalog.is_sqlite)
    return AuditVerifyResult(chain, triggers, anchor)


def verify_audit(app: AppContext, *, anchor: tuple[int, str] | None = None) -> AuditVerifyResult:
    """`verify_catalog` of the app's catalog."""
    return verify_catalog(app.catalog, anchor=anchor)


def report_trigger_problems(app: AppContext) -> list[str]:
    """Log each append-only trigger that is missing, disabled or changed as an error, and return
    them (empty: all stand). One query; a process calls it as it starts."""
    with app.catalog.connect() as connection, connection.begin():
        problems = trigger_problems(AlchemyExecutor(connection), sqlite=app.catalog.is_sqlite)
    for problem in problems:
        logger.error(
            "the audit log at %s is not protected: %s (run `enginecache audit verify`)",
            app.catalog.safe_url,
            problem,
        )
    return problems
