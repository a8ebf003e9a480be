"""Installed library versions, by distribution name, without importing them or importlib.metadata.

The `*.dist-info` / `*.egg-info` entries of the folders on `sys.path` are read directly: what
`importlib.metadata` finds, in the same order, without importing it (the host fingerprint runs in
every serving start; what the import would cost is in docs/performance.md). A folder's listing is
cached while its mtime stands; only where a path entry is an archive (a zip) is
importlib.metadata itself asked.
"""

from __future__ import annotations

import functools
import os
import stat
import sys

# Distribution names whose versions the host fingerprint reports beside its backends' libraries
# (each backend declares its own: `core.backends.declaration`), keyed by the name reported.
REPORTED_PACKAGES: dict[str, tuple[str, ...]] = {
    "onnx": ("onnx",),
    "cuda_python": ("cuda-python", "cuda-bindings"),
    "nvidia_ml_py": ("nvidia-ml-py",),
}

PathIndex = tuple[list[tuple[str, dict[str, tuple[str, ...]]]], bool]


def first_version(distributions: tuple[str, ...], *, index: PathIndex | None = None) -> str | None:
    """The version of the first of `distributions` installed (a library several distributions
    install: "tensorrt-rtx", "tensorrt_rtx_cu13" ...), without importing it; None where none is."""
    index = index or path_index()
    for dist in distributions:
        version = distribution_version(dist, index=index)
        if version is not None:
            return version
    return None


def package_version(name: str, *, index: PathIndex | None = None) -> str | None:
    """The installed version of a `REPORTED_PACKAGES` library by its reported name (any other name
    as a distribution name), without importing it."""
    return first_version(REPORTED_PACKAGES.get(name, (name,)), index=index)


_SEPARATORS = str.maketrans("-.", "__")


def _normalize(name: str) -> str:
    """PEP 503's normalized name with `_` for the separator (what a `.dist-info` folder is named by):
    runs of `-`, `_`, `.` become one `_`, lower case (str methods, no regular expression)."""
    normal = name.translate(_SEPARATORS).lower()
    while "__" in normal:
        normal = normal.replace("__", "_")
    return normal


@functools.lru_cache(maxsize=64)
def _listing(folder: str, _mtime_ns: int) -> dict[str, tuple[str, ...]]:
    """Distribution metadata entries of one sys.path folder by normalized name (cached while the
    folder's mtime stands: installing or removing a distribution adds or removes an entry)."""
    found: dict[str, list[str]] = {}
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return {}
    for entry in names:
        stem, dot, suffix = entry.rpartition(".")
        if dot and suffix in ("dist-info", "egg-info"):
            found.setdefault(_normalize(stem.split("-", 1)[0]), []).append(entry)
    return {k: tuple(v) for k, v in found.items()}


def _metadata_version(path: str) -> str | None:
    """The `Version:` header of a METADATA / PKG-INFO file (headers end at the first blank line)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if not line.strip():
                    break
                if line[:8].lower() == "version:":
                    return line[8:].strip() or None
    except OSError:
        return None
    return None


def path_index() -> PathIndex:
    """The distribution metadata entries of each folder on `sys.path` (one stat per folder; listings
    cached while a folder's mtime stands), and whether any path entry is an archive."""
    folders: list[tuple[str, dict[str, tuple[str, ...]]]] = []
    archives = False
    for entry in sys.path:
        folder = entry or "."
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            archives = True
            continue
        folders.append((folder, _listing(folder, st.st_mtime_ns)))
    return folders, archives


def distribution_version(dist: str, *, index: PathIndex | None = None) -> str | None:
    """`importlib.metadata.version(dist)`, or None where it is not installed, from the `.dist-info` /
    `.egg-info` entries of the folders on `sys.path` (first match in path order, as importlib.metadata
    finds it). Only where a path entry is an archive (a zip) is importlib.metadata itself asked."""
    wanted = _normalize(dist)
    folders, archives = index or path_index()
    for folder, listing in folders:
        for meta in listing.get(wanted, ()):
            full = os.path.join(folder, meta)
            header = "METADATA" if meta.endswith("dist-info") else "PKG-INFO"
            version = _metadata_version(os.path.join(full, header) if os.path.isdir(full) else full)
            if version is not None:
                return version
    if archives:
        from importlib import metadata

        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None
    return None
