"""This process's host fingerprint, taken once: a serving process asks for it on every load, and
the host does not change under a running process."""

from __future__ import annotations

import functools

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint


@functools.lru_cache(maxsize=1)
def local_host() -> HostFingerprint:
    return host_fingerprint()
