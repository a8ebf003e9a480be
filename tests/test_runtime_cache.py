"""TensorRT-RTX runtime caches: the reuse rule (core.runtimecache), pinned by a table.

Each row is a cache's key and a host's; the rule either hands the cache over or refuses it, and
`select` never returns a refused one.
"""

from __future__ import annotations

import pytest

from enginecache.core.runtimecache import CacheTarget, normalize_sm, parse_version, refusal, select

ENGINE = "a" * 64
OTHER_ENGINE = "b" * 64


def key(
    *,
    sku: str = "NVIDIA GeForce RTX 4090",
    sm: str = "sm89",
    rtx: str = "1.7.1",
    cuda: str = "12.9",
    engine: str = ENGINE,
) -> CacheTarget:
    return CacheTarget(engine, sku, sm, rtx, cuda)


HOST = key()

# (row name, cache key, host, handed over, words the refusal must contain)
TABLE = [
    ("same SKU", key(), HOST, True, ""),
    ("same SKU, name spelled otherwise", key(sku="nvidia  geforce rtx 4090"), HOST, True, ""),
    ("same SM, newer RTX on the host", key(sku="NVIDIA RTX 4000 Ada", rtx="1.6.0"), HOST, True, ""),
    ("same SM as 8.9", key(sm="8.9"), HOST, True, ""),
    ("same SM, newer CUDA minor on the host", key(cuda="12.4"), HOST, True, ""),
    ("older RTX on the host refused", key(rtx="1.8.0"), HOST, False, "newer than this host's 1.7.1"),
    ("other SM refused", key(sku="NVIDIA GeForce RTX 3090", sm="sm86"), HOST, False, "written on sm86"),
    ("other SM, same name refused", key(sm="sm86"), HOST, False, "this GPU is sm89"),
    ("older CUDA on the host refused", key(cuda="12.10"), HOST, False, "newer than this host's 12.9"),
    ("other CUDA major refused", key(cuda="11.8"), HOST, False, "another major version"),
    ("other engine refused", key(engine=OTHER_ENGINE), HOST, False, "written for engine"),
    ("unreadable RTX version refused", key(rtx="1.7-beta"), HOST, False, "not readable"),
    ("unreadable compute capability refused", key(sm="ampere"), HOST, False, "not readable"),
]


@pytest.mark.parametrize(
    ("cache", "host", "handed_over", "words"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_reuse_rule_table(cache: CacheTarget, host: CacheTarget, handed_over: bool, words: str) -> None:
    reason = refusal(cache, host)
    chosen = select([cache], host)
    if handed_over:
        assert reason is None
        assert chosen is cache
    else:
        assert reason is not None and words in reason
        assert chosen is None


def test_exact_sku_preferred_over_same_sm() -> None:
    same_sm = key(sku="NVIDIA RTX 4000 Ada", rtx="1.7.1")
    exact = key(rtx="1.6.0")
    assert select([same_sm, exact], HOST) is exact
    assert select([exact, same_sm], HOST) is exact


def test_closest_rtx_then_cuda_version_preferred() -> None:
    old = key(rtx="1.5.0", cuda="12.9")
    close = key(rtx="1.7.1", cuda="12.4")
    closest = key(rtx="1.7.1", cuda="12.8")
    too_new = key(rtx="1.8.0", cuda="12.9")
    assert select([old, close, closest, too_new], HOST) is closest


def test_select_never_returns_a_refused_cache() -> None:
    refused = [key(rtx="2.0"), key(sm="sm90"), key(cuda="13.0"), key(engine=OTHER_ENGINE)]
    assert select(refused, HOST) is None
    assert select([], HOST) is None


def test_ties_keep_the_first_given() -> None:
    first, second = key(), key()
    assert select([first, second], HOST) is first


@pytest.mark.parametrize(
    ("text", "expected"), [("sm86", "sm86"), ("sm_86", "sm86"), ("86", "sm86"), ("8.6", "sm86"), ("x", None)]
)
def test_compute_capability_spellings(text: str, expected: str | None) -> None:
    assert normalize_sm(text) == expected


def test_versions_are_dotted_integers_only() -> None:
    assert parse_version("12.9") == (12, 9)
    assert parse_version("1.7.1.116") == (1, 7, 1, 116)
    assert parse_version("12.9rc1") is None
    assert parse_version("") is None
