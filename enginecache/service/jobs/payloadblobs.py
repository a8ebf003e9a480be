"""The blob digests a job's payload names (a build's calibration file, a test-load's inputs: they are
blobs too), by the one rule gc (which keeps them) and backup (which copies them) both read payloads
with: every string in the payload that is a digest or a path whose last part is one. Some may name
no blob (a model digest)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enginecache.core.blobpaths import is_digest


def digest_of(path: str | None) -> str | None:
    """The digest `path` ends in (its last part, where that is a sha256 digest), else None."""
    name = Path(path).name if path else ""
    return name if is_digest(name) else None


def payload_digests(value: Any) -> Iterator[str]:
    """Every blob digest a job payload names: a string that is a digest or a path ending in one."""
    if isinstance(value, str):
        digest = digest_of(value)
        if digest is not None:
            yield digest
    elif isinstance(value, dict):
        for item in value.values():
            yield from payload_digests(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from payload_digests(item)
