"""Helpers of the audit log's tests (tests/test_audit_*.py): a logged-in actor and role rows written
directly."""

from __future__ import annotations

from enginecache.db.models import UserRoleRecord
from enginecache.service.access.audit import Actor
from enginecache.service.context import AppContext

ALICE = Actor("alice@example.com", "dashboard 10.0.0.7")  # a logged-in user (not local): her role is a row


def grant_role(app: AppContext, subject: str, role: str = "admin") -> None:
    """A role row written directly (no `role.set` event among the events a test counts)."""
    with app.catalog.write() as session:
        session.add(UserRoleRecord(subject=subject.lower(), role=role, granted_by="test"))
