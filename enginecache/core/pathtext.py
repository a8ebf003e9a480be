"""Path strings without pathlib: what a serving process's cache hit needs of its paths.

Neither onnxruntime nor tensorrt_rtx imports `pathlib` (which imports fnmatch, ntpath,
urllib.parse and ipaddress): a cache hit that builds no `Path` pays nothing for it (what it would
pay: docs/performance.md, "The import diet"). The hit path works on `str` paths; these give the strings
pathlib gives, for the two operations whose result is a catalog key or a store location
(tests/test_pathtext.py compares them with pathlib's on the cases that differ from `os.path`).
"""

from __future__ import annotations

import os


def _split(text: str) -> tuple[str, list[str]]:
    """A POSIX path's root ("", "/" or "//", as `PurePosixPath` keeps them) and its parts, without
    the empty and "." parts pathlib drops ("..", which pathlib keeps, is kept)."""
    root = ""
    if text.startswith("/"):
        root = "//" if text.startswith("//") and not text.startswith("///") else "/"
    return root, [part for part in text.split("/") if part and part != "."]


def absolute_text(path: str | os.PathLike[str]) -> str:
    """`str(Path(path).absolute())`: the path made absolute against the working directory and
    written as pathlib writes it (repeated slashes, "." parts and a trailing slash dropped; ".."
    and symbolic links kept, as `absolute()` keeps them). The stat cache's key on both load paths."""
    text = os.fspath(path)
    if not isinstance(text, str):
        raise TypeError(f"expected a str path, not {type(text).__name__}")
    if os.name != "posix":  # pathlib's rules for drives and UNC shares are its own
        from pathlib import Path

        return str(Path(text).absolute())
    root, parts = _split(text)
    if not root:
        root, base = _split(os.getcwd())
        parts = base + parts
    return root + "/".join(parts)


def resolved_text(path: str | os.PathLike[str]) -> str:
    """`str(Path(path).expanduser().resolve())`: home folder expanded, made absolute, symbolic
    links and ".." resolved (a missing part is kept as written, as `resolve(strict=False)` does)."""
    return os.path.realpath(os.path.expanduser(os.fspath(path)))
