"""A TensorRT-RTX plan's header, read without a GPU: the library version that wrote it and the compute
capabilities it was built for.

The layout is not a documented API; it was read from plans TensorRT-RTX 1.7 built for each compute
capability by itself and together, and is trusted only for the releases in `KNOWN_LAYOUTS`:

- bytes 0..4 and 28..32: `vtrt`;
- bytes 24, 25, 26: the major, minor and patch version of the TensorRT-RTX that wrote it (the
  library's own version check reads them: changing one makes `get_engine_validity` say the engine
  was "created with TensorRT-RTX version" another);
- bytes 32..40: a little-endian mask of the compute capabilities it runs on, bit 0 SM75, 1 SM80,
  2 SM86, 3 SM89, 4 SM120, 5 SM121 (a build naming none also sets bit 6, which this reader does not
  interpret and reports as it is).

A header of another release is read for its version only; its targets are not proven.
"""

from __future__ import annotations

import struct

MAGIC = b"vtrt"
VERSION_AT = 24
TARGETS_AT = 32
TARGET_BITS = ("sm75", "sm80", "sm86", "sm89", "sm120", "sm121")  # bit 0, 1, ...
KNOWN_LAYOUTS = frozenset({(1, 7)})  # (major, minor) releases whose layout was read and checked here


class RtxHeader:
    """The fields of one header (`parse`), or why the bytes are none (`problem`)."""

    def __init__(
        self,
        *,
        version: tuple[int, int, int] | None = None,
        targets: tuple[str, ...] | None = None,
        other_bits: int = 0,
        problem: str | None = None,
    ) -> None:
        self.version = version
        self.targets = targets
        self.other_bits = other_bits
        self.problem = problem

    @property
    def version_text(self) -> str | None:
        return ".".join(str(part) for part in self.version) if self.version else None


def parse(header: bytes) -> RtxHeader:
    """Read `header` (at least 40 bytes) as a TensorRT-RTX plan header."""
    if len(header) < TARGETS_AT + 8:
        return RtxHeader(problem=f"the file is {len(header)} bytes, shorter than a TensorRT-RTX header")
    if header[:4] != MAGIC or header[28:32] != MAGIC:
        return RtxHeader(problem=f"it does not start as a TensorRT-RTX plan (first bytes {header[:4]!r})")
    major, minor, patch = header[VERSION_AT], header[VERSION_AT + 1], header[VERSION_AT + 2]
    version = (major, minor, patch)
    if (major, minor) not in KNOWN_LAYOUTS:
        return RtxHeader(version=version)
    (mask,) = struct.unpack_from("<Q", header, TARGETS_AT)
    targets = tuple(sm for bit, sm in enumerate(TARGET_BITS) if mask & (1 << bit))
    return RtxHeader(version=version, targets=targets, other_bits=mask & ~((1 << len(TARGET_BITS)) - 1))
