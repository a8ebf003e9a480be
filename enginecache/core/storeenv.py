"""Whether this process has a remote blob store: the one question the load path asks of
`ENGINECACHE_STORE` (core.storeconfig parses the rest), answered with an environment lookup.

It imports nothing (not even `typing`): a cache hit loads it beside core.blobpaths for free.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Mapping

STORE_ENV = "ENGINECACHE_STORE"
LOCAL_VALUES = frozenset({"", "local"})  # the local folder only


def configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether a remote store is configured (the value is looked at, not parsed)."""
    return (os.environ if env is None else env).get(STORE_ENV, "").strip() not in LOCAL_VALUES
