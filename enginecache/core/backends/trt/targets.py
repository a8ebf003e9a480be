"""Build targets: what hardware an engine is built for, per backend.

- `rtx` (TensorRT for RTX): a list of compute capabilities, chosen at build time on any host.
- `trt` (TensorRT): the GPU the build runs on (TensorRT builds for the device it tunes on).
- `ort` (ONNX Runtime CPU): the CPU architecture and ISA level the optimized model was made on.
"""

from __future__ import annotations

import re

from enginecache.core.targettext import split_requested
from enginecache.errors import TargetError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Iterable

# Compute capabilities TensorRT-RTX 1.7 can target (its ComputeCapability enum).
RTX_COMPUTE_CAPABILITIES: tuple[str, ...] = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")
# What TensorRT-RTX builds for when no compute capability is set ("8.0, 8.6, 8.9, 12.0, and later":
# NVIDIA's CPU-only AOT page). Turing (sm75) must be asked for explicitly.
RTX_DEFAULT_TARGETS: tuple[str, ...] = ("sm80", "sm86", "sm89", "sm120", "sm121")

_SM_PATTERN = re.compile(r"^sm_?(\d{2,3})$")


def normalize_sm(text: str) -> str:
    """'SM86', 'sm_86', '8.6', '86' -> 'sm86'; anything else raises TargetError."""
    cleaned = text.strip().lower()
    if re.fullmatch(r"\d+\.\d+", cleaned):
        major, minor = cleaned.split(".")
        return f"sm{major}{minor}"
    if cleaned.isdigit():
        cleaned = "sm" + cleaned
    match = _SM_PATTERN.match(cleaned)
    if match is None:
        raise TargetError(f"unknown target {text!r}: expected a compute capability like sm86 or 8.6")
    return "sm" + match.group(1)


def sm_to_capability(sm: str) -> tuple[int, int]:
    """'sm86' -> (8, 6); 'sm120' -> (12, 0)."""
    digits = normalize_sm(sm)[2:]
    return int(digits[:-1]), int(digits[-1])


def capability_to_sm(major: int, minor: int) -> str:
    return f"sm{major}{minor}"


def parse_rtx_targets(values: Iterable[str] | None) -> tuple[str, ...]:
    """Validate TensorRT-RTX targets; empty or None means the library's default set."""
    items = split_requested(values)
    if not items:
        return RTX_DEFAULT_TARGETS
    targets: list[str] = []
    for item in items:
        sm = normalize_sm(item)
        if sm not in RTX_COMPUTE_CAPABILITIES:
            raise TargetError(
                f"unknown target {item!r} for TensorRT-RTX: it builds for "
                + ", ".join(RTX_COMPUTE_CAPABILITIES)
                + " (SM90/H100/H200 is not supported by TensorRT-RTX; use --backend trt there)"
            )
        if sm not in targets:
            targets.append(sm)
    return tuple(sorted(targets, key=lambda s: sm_to_capability(s)))


def parse_capabilities(requested: Iterable[str]) -> tuple[str, ...]:
    """Normalize any compute capabilities (comma lists allowed), deduplicated and sorted."""
    items = {normalize_sm(part) for part in split_requested(requested)}
    return tuple(sorted(items, key=sm_to_capability))


def rtx_targets_are_default(targets: Iterable[str]) -> bool:
    return tuple(targets) == RTX_DEFAULT_TARGETS
