"""The store's gc lock: an `flock` on `<home>/gc.lock`, shared by publishers, exclusive for gc.

Why a lock at all, and what each side holds it for: core.store's docstring ("Publishing and gc").
A publish takes it shared (an open, a flock and a close; publishers never wait for each other), and
so does a backup's consistent copy; gc and `engine delete` take it exclusive and wait for every
publish (and backup) under way. The lock is released by closing its file descriptor, so a process
that dies holds nothing.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from enginecache.errors import StoreError

logger = logging.getLogger(__name__)


class StoreLock:
    """The lock file at `path` (its folder is made on first use)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def hold(self, *, exclusive: bool) -> Iterator[None]:
        operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as err:
            raise StoreError(f"could not open the store's lock {self.path}: {err}") from err
        try:
            self._take(fd, operation)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _take(self, fd: int, operation: int) -> None:
        try:
            try:
                fcntl.flock(fd, operation | fcntl.LOCK_NB)
            except BlockingIOError:
                if operation == fcntl.LOCK_EX:
                    logger.info("waiting for the publishes (or a backup) holding %s to finish", self.path)
                fcntl.flock(fd, operation)
        except OSError as err:
            raise StoreError(f"could not lock the store's {self.path}: {err}") from err


def held_by_a_live_process(path: Path) -> bool:
    """Whether some process holds an `flock` on the file at `path` now (a writer's claim on its work:
    a fetch's resume state, a backup's claim, a restore's folder). False where the file is gone or
    is a symbolic link (never a writer's)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        if err.errno == errno.ELOOP:  # a symbolic link
            return False
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False
