"""The folders a backup or a restore writes before publishing them, held while their writer runs, and
how `enginecache gc` tells one a killed writer left (service.maintenance.gc.debris).

- A backup writes `.<DEST name>.partial-<token>` beside DEST and renames it to DEST once complete.
  DEST is outside the home, so before it makes that folder the backup writes a claim
  `<store tmp>/backup-<token>.claim` naming it (JSON: `work`, `dest`, `pid`, `host`), and holds the
  claim's flock until it ends, when the claim is removed. The claim is where gc of the home looks:
  a claim whose lock nobody holds is a killed backup's, and names its partial folder.
- A restore writes `.<HOME name>.restore-<token>` beside HOME (and, where the SQLite catalog lies
  outside HOME, `.<catalog name>.restore-<that folder's name>` beside the catalog) and renames it to
  HOME once complete. It holds a flock on the folder itself while it runs; gc of HOME finds the
  folder by its name beside HOME.

A kill -9 releases the flocks, so "held" means "its writer is alive".
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from enginecache.core.storelock import held_by_a_live_process
from enginecache.errors import BackupRefusedError

CLAIM_SUFFIX = ".claim"
_CLAIM_NAME = re.compile(r"backup-([0-9a-f]{16})\.claim")
_PARTIAL_TOKEN = re.compile(r"\..+\.partial-([0-9a-f]{16})")


def is_claim_name(name: str) -> bool:
    """Whether an entry of a store's tmp/ is named as a backup's claim."""
    return _CLAIM_NAME.fullmatch(name) is not None


def claim_path(tmp_dir: Path, work: Path) -> Path | None:
    """The claim that names the backup folder `work` (by the token in its name), or None where
    `work` is not named as a backup folder."""
    found = _PARTIAL_TOKEN.fullmatch(work.name)
    return tmp_dir / f"backup-{found.group(1)}{CLAIM_SUFFIX}" if found else None


def restore_prefix(home: Path) -> str:
    """The name a restore's folder beside `home` starts with."""
    return f".{home.name}.restore-"


def staged_catalog_prefix(catalog: Path, home: Path) -> str:
    """The name a restore's SQLite catalog staged beside `catalog` (outside the home) starts with."""
    return f".{catalog.name}.restore-{restore_prefix(home)}"


@contextlib.contextmanager
def backup_folder(tmp_dir: Path, dest: Path) -> Iterator[Path]:
    """A new empty folder beside `dest` to write a backup in, claimed in `tmp_dir` (see the module
    docstring) until the block ends; the claim is removed then, the folder is the caller's to
    publish or remove. BackupRefusedError where either cannot be made."""
    token = secrets.token_hex(8)
    work = dest.parent / f".{dest.name}.partial-{token}"
    claim = tmp_dir / f"backup-{token}{CLAIM_SUFFIX}"
    record = {"work": str(work), "dest": str(dest), "pid": os.getpid(), "host": socket.gethostname()}
    try:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(claim, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise BackupRefusedError(f"cannot write the backup's claim {claim} in the home's store: {err}") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(record).encode())
        try:
            work.mkdir(mode=0o700)
        except OSError as err:
            raise BackupRefusedError(f"cannot make the backup's folder {work}: {err}") from err
        yield work
    finally:
        claim.unlink(missing_ok=True)
        os.close(fd)


@contextlib.contextmanager
def restore_folder(home: Path) -> Iterator[Path]:
    """A new empty folder beside `home` to restore into, its flock held until the block ends; the
    folder is the caller's to publish or remove."""
    work = Path(tempfile.mkdtemp(prefix=restore_prefix(home), dir=home.parent))
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield work
    finally:
        os.close(fd)


def held(path: Path) -> bool:
    """Whether a live writer holds the flock of `path` (a claim file or a restore folder); False
    where `path` is gone."""
    return held_by_a_live_process(path)


def read_claim(claim: Path) -> dict[str, Any]:
    """A claim's record; {} where it is unreadable (a backup killed while writing it)."""
    try:
        record = json.loads(claim.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def claimed_folder(claim: Path) -> Path | None:
    """The backup folder a claim names, where it names one by the name a backup gives it (an
    absolute path, `.<name>.partial-<the claim's token>`); None otherwise."""
    found = _CLAIM_NAME.fullmatch(claim.name)
    work = read_claim(claim).get("work")
    if found is None or not isinstance(work, str):
        return None
    path = Path(work)
    token = _PARTIAL_TOKEN.fullmatch(path.name)
    if not path.is_absolute() or token is None or token.group(1) != found.group(1):
        return None
    return path


def remove_unheld(path: Path, *, lock: Path | None = None, claim: Path | None = None) -> bool:
    """Remove a backup or restore folder (or a staged catalog file) at `path`, and the backup's
    `claim` where given, unless its writer is alive: it holds the flock of `lock` (default `path`
    itself; a backup's is its claim). Whether it was removed (or was gone already). OSError where
    removing fails."""
    try:
        fd = os.open(lock or path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, onerror=_unless_gone)
        else:
            path.unlink(missing_ok=True)
        if claim is not None:
            claim.unlink(missing_ok=True)
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def _unless_gone(_function: Any, _path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
