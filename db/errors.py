"""Typed errors of the catalog layer."""

from __future__ import annotations


class CatalogError(Exception):
    """Base of every error raised by `db`."""


class NotFoundError(CatalogError):
    """No row matches the given id or name."""


class AmbiguousError(CatalogError):
    """A name matches more than one row."""


class StaleLeaseError(CatalogError):
    """A write by a job holder whose lease token is no longer the job's (expired, taken over)."""
