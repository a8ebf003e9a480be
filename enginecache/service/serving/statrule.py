"""When a cached ONNX digest may be trusted: the stat cache's rule, stdlib only.

The digest of a model (model file plus external data) is cached per (host, path) with the
`[name, size, mtime_ns, ctime_ns, inode]` of each file (`stat_entry`). It is trusted only while
every one of them still matches and the entry is not racy (`service.serving.statcache` explains both); the
ORM path (`service.serving.statcache`) and the stdlib cache hit (`service.serving.hitpath`) apply this same rule.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

    from _typeshed import StrPath  # str | os.PathLike[str]

# Filesystems with coarse timestamps: a file modified within this long after it was hashed could
# keep the same mtime, so such an entry is "racy" (git's term) and re-hashed on the next lookup.
RACY_WINDOW_NS = 2_000_000_000


def stat_entry(path: StrPath) -> list[Any]:
    """`[name, size, mtime_ns, ctime_ns, inode]` of a file (`path` as pathlib writes it: no trailing slash)."""
    st = os.stat(path)
    return [os.path.basename(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def cached_files_match(model: StrPath, model_stat: list[Any], files: list[list[Any]] | None, racy: bool) -> bool:
    """Whether a cache entry's `files` still describe the model (`model_stat`, its current stat) and
    each external data file beside it; a racy entry never does."""
    if racy or not files or files[0] != model_stat:
        return False
    try:
        folder = os.path.dirname(model)
        current = [model_stat] + [stat_entry(os.path.join(folder, str(entry[0]))) for entry in files[1:]]
    except OSError:
        return False
    return current == files
