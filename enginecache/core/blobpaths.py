"""Where the store keeps a digest's bytes, as a string operation (no I/O, nothing imported).

The store is content addressed (core.store's layout): an engine blob is `objects/sha256/<2 hex>/<sha256>`
under the home, a model bundle `models/<model digest>/<file names>`. Every load, `check` and build
derives a path from the digest here rather than trusting a path column of the catalog (an edited
`engines.blob_path` or `models.store_path` names some other file; the digest names the bytes that were
verified). Cheap enough for the cache hit of a new serving process: it imports nothing new, and `blob_file`
gives the blob's path as a string (the hit builds no `pathlib.Path`: core.pathtext says why).
tests/test_model_integrity.py checks this layout against `core.store.ArtifactStore`.
"""

from __future__ import annotations

import os

from enginecache.errors import IntegrityCheckError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from pathlib import Path

_HEX = frozenset("0123456789abcdef")
BLOB_FOLDER = "objects/sha256"
"""The store's folder of engine blobs, relative to the home: `blob_relative` names a blob in it."""


def is_digest(value: object) -> bool:
    """A sha256 hex digest as the catalog records them (64 lowercase hex characters)."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def _checked_blob_digest(sha256: str | None) -> str:
    if sha256 is None or not is_digest(sha256):
        raise IntegrityCheckError(f"recorded blob digest {sha256!r} is not a sha256 digest")
    return sha256


def blob_relative(sha256: str | None) -> str:
    """The engine blob named by `sha256` relative to the home: 'objects/sha256/<2 hex>/<sha256>'.
    Raises IntegrityCheckError when the recorded value is not a sha256 digest (nothing may be read
    in its place)."""
    digest = _checked_blob_digest(sha256)
    return f"{BLOB_FOLDER}/{digest[:2]}/{digest}"


def blob_path(home: Path, sha256: str | None) -> Path:
    """The engine blob named by `sha256` under `home` (IntegrityCheckError as `blob_relative`)."""
    return home / blob_relative(sha256)


def blob_file(home: str | os.PathLike[str], sha256: str | None) -> str:
    """`blob_path` as a string (`home` as given, joined with os.path): for the cache hit, which
    builds no `Path`. IntegrityCheckError as `blob_relative`."""
    return os.path.join(home, blob_relative(sha256))


def model_dir(home: Path, digest: str) -> Path:
    """The folder of the model bundle named by `digest` under `home` (IntegrityCheckError for a
    value that is not a digest)."""
    if not is_digest(digest):
        raise IntegrityCheckError(f"recorded model digest {digest!r} is not a sha256 digest")
    return home / "models" / digest


def model_file(home: Path, digest: str, filename: str) -> Path:
    """The stored model file of the bundle `digest`: its folder and the recorded file name, which must
    be one plain name (no folder part, not '.' or '..'): IntegrityCheckError otherwise."""
    if not filename or filename in (".", "..") or any(c in filename for c in "/\\\x00"):
        raise IntegrityCheckError(f"recorded model file name {filename!r} is not a plain file name")
    return model_dir(home, digest) / filename
