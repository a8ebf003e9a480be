"""This process's host fingerprint, taken once: a serving process asks for it on every load, and
the host does not change under a running process.

`local_host(probe_gpus=False)` is the fingerprint without NVML, for a CPU backend's cache hit; once a
full fingerprint has been taken it answers that too.
"""

from __future__ import annotations

from enginecache.core.fingerprint import host_fingerprint

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from enginecache.core.fingerprint import HostFingerprint

_TAKEN: dict[bool, HostFingerprint] = {}


def local_host(*, probe_gpus: bool = True) -> HostFingerprint:
    full = _TAKEN.get(True)
    if full is not None:
        return full
    if probe_gpus not in _TAKEN:
        _TAKEN[probe_gpus] = host_fingerprint(probe_gpus=probe_gpus)
    return _TAKEN[probe_gpus]


def forget_local_host() -> None:
    """Take the fingerprint afresh on the next call (tests that change the host facts)."""
    _TAKEN.clear()
