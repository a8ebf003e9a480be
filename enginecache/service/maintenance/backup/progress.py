"""Progress of a backup or restore, for the operator: each step is logged and handed to the caller's
`progress(phase, message)` (the CLI prints it on stderr)."""

from __future__ import annotations

import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

# progress(phase, message): "snapshot" once the catalog's state is taken (before any blob is copied),
# "copied" once every file is in place, "published" at the end.
Progress = Callable[[str, str], None]


def report(progress: Progress | None, phase: str, message: str) -> None:
    logger.info("%s", message)
    if progress is not None:
        progress(phase, message)
