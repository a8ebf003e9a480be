"""Which TensorRT-RTX runtime cache a host may be handed: the one owner of the reuse rule.

A runtime cache (TensorRT-RTX's `IRuntimeCache`, serialized) holds the kernels TensorRT-RTX compiled
for one GPU at an engine's first inference. It is keyed by (engine sha256, GPU SKU, compute
capability, TensorRT-RTX version, CUDA version), and a host may use it only when:

- it was written for the same engine (its sha256);
- the host's GPU has the same compute capability (same SM); the same SKU is preferred, not required;
- the host's TensorRT-RTX version is the cache's or newer;
- the host's CUDA version has the cache's major version and is the cache's or newer (the installed
  `tensorrt_rtx.IRuntimeCache.deserialize` docstring: "the CUDA driver version must share the same
  major version and be the same or newer").

`refusal` says why a cache is refused (None: usable); `select` picks the best usable one: the exact
SKU before the same SM, then the closest TensorRT-RTX version, then the closest CUDA version, and
never a cache the rule refuses. TensorRT-RTX checks again when it deserializes (its docstring lists
an exact TensorRT-RTX version and device properties among its checks), so a cache this rule hands
over can still be refused there; the session then compiles as if it had none.

A version that is not dotted integers ("12.9", "1.7.1.116") never matches: it is refused, not guessed.
Pure: no GPU, no catalog, no store (`host_target` reads a fingerprint given to it).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from enginecache.core.hostfingerprint import HostFingerprint

_VERSION = re.compile(r"^\d+(\.\d+)*$")
_SM = re.compile(r"^(?:sm_?)?(\d+)(?:\.(\d+))?$")


class RuntimeCacheKey(Protocol):
    """What the rule reads from a cache: a catalog row or a manifest entry alike."""

    @property
    def engine_sha256(self) -> str: ...
    @property
    def gpu_sku(self) -> str: ...
    @property
    def compute_capability(self) -> str: ...
    @property
    def rtx_version(self) -> str: ...
    @property
    def cuda_version(self) -> str: ...


K = TypeVar("K", bound=RuntimeCacheKey)


@dataclass(frozen=True)
class CacheTarget:
    """The host a cache is asked for (or the key a cache is published under): the same five fields."""

    engine_sha256: str
    gpu_sku: str
    compute_capability: str
    rtx_version: str
    cuda_version: str


# The backends whose engines have runtime caches, looked up by name (the backend owns the cache's
# hand-over: core/backends/trt/runtimecache.py)
RUNTIME_CACHE_BACKENDS = frozenset({"rtx"})
RTX_LIBRARY = "tensorrt_rtx"  # TensorRT-RTX's library, as a host fingerprint's `packages` names it


def has_runtime_caches(backend: str) -> bool:
    """Whether engines of `backend` have runtime caches (TensorRT-RTX's)."""
    return backend in RUNTIME_CACHE_BACKENDS


def host_target(engine_sha256: str, host: HostFingerprint) -> CacheTarget | None:
    """`host`'s key for `engine_sha256`: its first GPU's name and compute capability (NVML), its
    TensorRT-RTX version and CUDA driver version; None where any of them is unknown (no GPU, no
    NVML, no TensorRT-RTX), so no cache is chosen for it."""
    rtx = host.packages.get(RTX_LIBRARY)
    if not host.gpus or rtx is None or host.cuda_driver_version is None:
        return None
    gpu = host.gpus[0]
    return CacheTarget(engine_sha256, gpu.name, gpu.compute_capability, rtx, host.cuda_driver_version)


def normalize_sku(name: str) -> str:
    """A GPU name as NVML reports it, compared without case or repeated blanks."""
    return " ".join(name.split()).casefold()


def normalize_sm(text: str) -> str | None:
    """A compute capability as "sm86" ("sm86", "sm_86", "86", "8.6"); None when it is none of those."""
    match = _SM.match(text.strip().lower())
    if match is None:
        return None
    major, minor = match.groups()
    return f"sm{major}{minor}" if minor is not None else f"sm{major}"


def parse_version(text: str) -> tuple[int, ...] | None:
    """Dotted integers as a tuple ("12.9" -> (12, 9)); None for anything else."""
    text = text.strip()
    if not _VERSION.match(text):
        return None
    return tuple(int(part) for part in text.split("."))


def _at_least(host: tuple[int, ...], cache: tuple[int, ...]) -> bool:
    width = max(len(host), len(cache))
    return host + (0,) * (width - len(host)) >= cache + (0,) * (width - len(cache))


def refusal(cache: RuntimeCacheKey, host: RuntimeCacheKey) -> str | None:
    """Why `cache` must not be handed to `host`'s runtime, in words; None when the rule allows it."""
    if cache.engine_sha256 != host.engine_sha256:
        return f"written for engine {cache.engine_sha256[:12]}, not {host.engine_sha256[:12]}"
    cache_sm, host_sm = normalize_sm(cache.compute_capability), normalize_sm(host.compute_capability)
    if cache_sm is None or host_sm is None:
        return f"compute capability not readable: cache {cache.compute_capability!r}, host {host.compute_capability!r}"
    if cache_sm != host_sm:
        return f"written on {cache_sm}, this GPU is {host_sm}"
    cache_rtx, host_rtx = parse_version(cache.rtx_version), parse_version(host.rtx_version)
    if cache_rtx is None or host_rtx is None:
        return f"TensorRT-RTX version not readable: cache {cache.rtx_version!r}, host {host.rtx_version!r}"
    if not _at_least(host_rtx, cache_rtx):
        return f"written by TensorRT-RTX {cache.rtx_version}, newer than this host's {host.rtx_version}"
    cache_cuda, host_cuda = parse_version(cache.cuda_version), parse_version(host.cuda_version)
    if cache_cuda is None or host_cuda is None:
        return f"CUDA version not readable: cache {cache.cuda_version!r}, host {host.cuda_version!r}"
    if cache_cuda[0] != host_cuda[0]:
        return f"written under CUDA {cache.cuda_version}, another major version than this host's {host.cuda_version}"
    if not _at_least(host_cuda, cache_cuda):
        return f"written under CUDA {cache.cuda_version}, newer than this host's {host.cuda_version}"
    return None


def _rank(cache: RuntimeCacheKey, host: RuntimeCacheKey) -> tuple[bool, tuple[int, ...], tuple[int, ...]]:
    """Higher is better: the exact SKU, then the closest (newest not above the host's) versions."""
    return (
        normalize_sku(cache.gpu_sku) == normalize_sku(host.gpu_sku),
        parse_version(cache.rtx_version) or (),
        parse_version(cache.cuda_version) or (),
    )


def select(caches: Iterable[K], host: RuntimeCacheKey) -> K | None:
    """The best cache the rule allows for `host` (exact SKU first, then same SM; the closest
    TensorRT-RTX, then CUDA, version), or None. A refused cache is never returned; ties keep the
    first given (callers list newest first)."""
    best: K | None = None
    best_rank: tuple[bool, tuple[int, ...], tuple[int, ...]] | None = None
    for cache in caches:
        if refusal(cache, host) is not None:
            continue
        rank = _rank(cache, host)
        if best_rank is None or rank > best_rank:
            best, best_rank = cache, rank
    return best
