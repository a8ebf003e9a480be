"""Where an upload is written: a private staging folder beside its destination, renamed to the
destination only once the whole upload is in (`staged`); a refusal or a failure removes it, so
nothing half-written is ever left or registered. OSErrors while writing (`writing`) are the
upload's fault where the name cannot be a file name here (UploadError), else the host's
(StoreError: a disk full or failing, permissions)."""

from __future__ import annotations

import contextlib
import errno
import logging
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from enginecache.errors import StoreError, UploadError

logger = logging.getLogger(__name__)

COPY_CHUNK = 1 << 20

# Errors writing a member that say its name cannot be a file name here: the upload's fault.
_BAD_NAME_ERRNOS = frozenset({errno.ENAMETOOLONG, errno.EILSEQ})


@dataclass(frozen=True)
class UploadedFile:
    """One uploaded file: its name as the browser sent it and a readable stream."""

    name: str
    stream: BinaryIO
    size: int


def remove_tree(path: Path) -> None:
    """Remove a staging folder; a failure to remove it is logged (the error that led here is what
    the caller raises, and gc removes what is left under the store's tmp/)."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return
    except OSError as err:
        logger.warning("could not remove the staging folder %s: %s", path, err)


@contextlib.contextmanager
def staged(dest: Path, what: str) -> Iterator[Path]:
    """A fresh folder beside `dest`, renamed to `dest` when the block ends well, removed otherwise."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    except OSError as err:
        raise StoreError(f"could not make a staging folder for {what} in {dest.parent}: {err.strerror}") from err
    try:
        yield staging
        with writing(what, None, dest):
            staging.rename(dest)
    except BaseException:
        remove_tree(staging)
        raise


@contextlib.contextmanager
def writing(what: str, member: str | None, where: Path) -> Iterator[None]:
    """OSErrors while writing: the member's name unusable here is the upload's fault (UploadError);
    anything else (disk full, I/O error, permissions) is the host's (StoreError)."""
    try:
        yield
    except OSError as err:
        named = f"member {member!r}" if member is not None else "it"
        if err.errno in _BAD_NAME_ERRNOS:
            raise UploadError(f"{what}: {named} cannot be written under that name: {err.strerror}") from err
        raise StoreError(
            f"could not write {what} ({named}) into {where}: {err.strerror}; nothing of it was kept"
        ) from err
