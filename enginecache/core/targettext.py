"""An engine's targets as text: the catalog's one column ('sm86,sm89') and a command line's values.

The catalog keeps an engine's targets comma-separated in one column, and a command line takes
`--target sm86,sm89` or the option repeated; both are split here, so every reader of either gets
the same tuple.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Iterable


def split_targets(text: str | None) -> tuple[str, ...]:
    """The catalog's 'sm86,sm89' as ('sm86', 'sm89'); () for '' or None."""
    return tuple(t for t in (text or "").split(",") if t)


def join_targets(targets: Iterable[str]) -> str:
    """Targets as the catalog writes them: 'sm86,sm89' (`split_targets` reads it back)."""
    return ",".join(targets)


def split_requested(values: Iterable[str] | None) -> tuple[str, ...]:
    """Targets as a command line gives them, each value a comma list: parts stripped, empty ones
    dropped, in the order given."""
    return tuple(part.strip() for value in values or () for part in value.split(",") if part.strip())
