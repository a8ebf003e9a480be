"""A blob fetched by byte ranges, in parallel, verified, and resumable after a kill
(`ResumeState.fill`): what `ArtifactStore.fetch` does for `enginecache pull` and for a host that
lacks a blob.

A ranged fetch cuts the blob into ranges of `chunk_bytes`: its recorded chunk digests' chunk size
(core.chunkdigests), or CHUNK_DIGEST_BYTES where it has none. Up to `concurrency` ranges are read at
once from the source (`read_range`: a ranged GET through the store's client, or a read of a store
folder) and written with `os.pwrite` at their offset into one file preallocated to the blob's size.
Everything a fetch writes lives in its resume state, one folder per blob in the store's `tmp/`:

    tmp/<sha256>.pull/lock   flock'd by the one fetch at work on the blob
    tmp/<sha256>.pull/data   the blob's bytes, at their offsets
    tmp/<sha256>.pull/done   a header line (blob, size, range size, kind), then the index of each
                             range that has landed, one a line

Verification, and when the blob is whole. Where the blob has chunk digests, each range is checked
against its chunk's digest as it lands, before its line is written (a mismatch names the chunk and
its byte range), and the file is whole once every chunk of the recorded size passed: the digests are
recorded with the whole-file sha256 in the pass that computed it, so that proves what the whole-file
digest would, and nothing is hashed twice. Where it has none (rows recorded before chunk digests),
ranges are recorded as they land and the whole file's sha256 is checked once every range is there.
The caller gives the file its name only after that (`ArtifactStore.fetch`).

Resuming. A fetch that was killed leaves its state; the next fetch of the blob takes it over and
reads from the source only the ranges not recorded. With chunk digests the recorded ones are hashed
again first (on the same threads, a range each), and one that no longer matches is fetched again, so
a line never needs its data to be on disk first; without them, a range's data is fdatasync'd before
its line is written, and the whole-file check covers it. A state made for another size, range size
or kind is started afresh.

Failures. A source that cannot be reached or read raises StoreError and keeps the state (the next
fetch resumes it). Bytes that are not the blob raise IntegrityCheckError; the caller then removes
the state (the source is wrong, and reading it again would read the same bytes). Memory: at most one
range per thread (`concurrency` x `chunk_bytes`), never the whole blob.

Ownership. The lock keeps two fetches of one blob apart (the second waits, then finds the blob in
place); a fetch that succeeds removes its state; a state no fetch holds and nothing changed for
longer than gc's resume age is removed by `enginecache gc` (`remove_unheld`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from enginecache.core.chunkdigests import CHUNK_DIGEST_BYTES, ChunkDigests, chunk_ranges
from enginecache.core.hashing import StreamHasher, hash_stream
from enginecache.core.storelock import held_by_a_live_process
from enginecache.errors import IntegrityCheckError, StoreError

logger = logging.getLogger(__name__)

STATE_SUFFIX = ".pull"
LOCK_NAME = "lock"
DATA_NAME = "data"
DONE_NAME = "done"
_FORMAT = "enginecache-resume-1"
_STATE_NAME = re.compile(r"[0-9a-f]{64}\.pull")

# The bytes [start, end) of the source, as a buffer (an S3 ranged GET, a read of a file).
ReadRange = Callable[[int, int], memoryview]


@dataclass(frozen=True)
class RangedFetch:
    """What one `fill` did: bytes read from the source now, and bytes a killed fetch had left that
    were kept (re-verified where the blob has chunk digests)."""

    fetched_bytes: int
    resumed_bytes: int


def state_folder(tmp_dir: Path, sha256: str) -> Path:
    """Where a ranged fetch of blob `sha256` keeps its resume state."""
    return tmp_dir / f"{sha256}{STATE_SUFFIX}"


def is_state_name(name: str) -> bool:
    """Whether an entry of a store's `tmp/` is named as a resume state."""
    return _STATE_NAME.fullmatch(name) is not None


@contextlib.contextmanager
def hold_state(folder: Path) -> Iterator[ResumeState]:
    """The resume state at `folder`, made where missing and held (its lock) until the block ends;
    waits while another fetch holds it. OSError where it cannot be made or locked."""
    while True:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _still_named(fd, folder / LOCK_NAME):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed (by a fetch that finished, or by gc) while we waited: make it again
    try:
        yield ResumeState(folder)
    finally:
        os.close(fd)


def state_held(folder: Path) -> bool:
    """Whether a fetch holds the resume state at `folder` now."""
    return held_by_a_live_process(folder / LOCK_NAME)


def remove_unheld(folder: Path) -> bool:
    """Remove the resume state at `folder` unless a fetch holds it; whether it was removed (or was
    gone already). It is renamed aside under its lock first, so a fetch that starts meanwhile makes
    a fresh one and one that was waiting for the lock starts afresh too. OSError where removing fails."""
    try:
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        if folder.is_dir():  # no lock: no fetch ever held it (or one died making it)
            shutil.rmtree(folder, onerror=_unless_gone)
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if not _still_named(fd, folder / LOCK_NAME):
            return True
        aside = folder.with_name(f".{folder.name}.removing-{uuid.uuid4().hex[:8]}")
        os.rename(folder, aside)
        shutil.rmtree(aside, onerror=_unless_gone)
        return True
    finally:
        os.close(fd)


class ResumeState:
    """A resume state this process holds (made by `hold_state`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data = folder / DATA_NAME
        self._done = folder / DONE_NAME

    def remove(self) -> None:
        """Remove the state (the caller still holds its lock; a fetch waiting for it then starts afresh)."""
        shutil.rmtree(self.folder, onerror=_unless_gone)

    def fill(
        self,
        read_range: ReadRange,
        *,
        name: str,
        sha256: str,
        size: int,
        chunks: ChunkDigests | None,
        concurrency: int,
        chunk_bytes: int = CHUNK_DIGEST_BYTES,
    ) -> RangedFetch:
        """Make `data` the blob's `size` bytes (module docstring), reading from `read_range` only the
        ranges the state lacks, up to `concurrency` at once; `chunk_bytes` is the range size where
        `chunks` is None. Returns once `data` is whole, verified and fsynced. IntegrityCheckError: the
        source's bytes are not the blob (`name` says which in the message); StoreError: the source
        failed, or no room for the blob here; OSError: the state cannot be written."""
        if chunks is not None:
            chunk_bytes = chunks.chunk_bytes
            ranges = chunks.ranges(size)  # IntegrityCheckError where the list does not cover `size`
        else:
            ranges = chunk_ranges(size, chunk_bytes)
        header = f"{_FORMAT} {sha256} {size} {chunk_bytes} {'chunks' if chunks is not None else 'whole'}"
        done = self._recorded(header, size)
        fd = os.open(self.data, os.O_RDWR | os.O_CLOEXEC)
        try:
            record = os.open(self._done, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                got = _Transfer(fd, record, read_range, name, ranges, chunks, done).run(concurrency)
            finally:
                os.close(record)
            if chunks is None:
                _check_whole(fd, name, sha256)
            os.fsync(fd)
        finally:
            os.close(fd)
        return got

    def _recorded(self, header: str, size: int) -> set[int]:
        """The ranges recorded as done by a state made with the same `header`; else a fresh state
        (the data preallocated to `size`, the header written) and none."""
        try:
            lines = self._done.read_bytes().decode("ascii", "replace").split("\n")
            if lines[0] == header and self.data.stat().st_size == size:
                # the last element follows the last newline: a line cut by a kill is not counted
                return {int(line) for line in lines[1:-1] if line.isdigit()}
        except FileNotFoundError:
            pass
        self._done.unlink(missing_ok=True)
        fd = os.open(self.data, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if size:
                _preallocate(fd, size, self.data)
        finally:
            os.close(fd)
        with open(self._done, "w", encoding="ascii") as stream:
            stream.write(header + "\n")
        return set()


class _Transfer:
    """The ranges of one `fill`, on a pool of threads: each re-verifies its recorded range or reads it
    from the source, checks it, writes it at its offset and records it."""

    def __init__(
        self,
        fd: int,
        record: int,
        read_range: ReadRange,
        name: str,
        ranges: list[tuple[int, int]],
        chunks: ChunkDigests | None,
        done: set[int],
    ) -> None:
        self._fd, self._record, self._read = fd, record, read_range
        self._name, self._ranges, self._chunks, self._done = name, ranges, chunks, done
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def run(self, concurrency: int) -> RangedFetch:
        pool = ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="ranged-fetch")
        futures: list[Future[tuple[int, int]]] = []
        try:
            futures = [pool.submit(self._one, i) for i in range(len(self._ranges))]
            wait(futures, return_when=FIRST_EXCEPTION)
        finally:
            self._stop.set()  # after a failure or an interrupt, what is still queued does nothing
            pool.shutdown(wait=True, cancel_futures=True)
        errors = [error for f in futures if not f.cancelled() and (error := f.exception()) is not None]
        if errors:  # an integrity failure first: it decides what the caller does with the state
            raise next((e for e in errors if isinstance(e, IntegrityCheckError)), errors[0])
        results = [f.result() for f in futures]
        return RangedFetch(sum(got for got, _ in results), sum(kept for _, kept in results))

    def _one(self, index: int) -> tuple[int, int]:
        """(bytes read from the source, bytes kept) for range `index`."""
        if self._stop.is_set():
            return 0, 0
        start, end = self._ranges[index]
        if index in self._done:
            if self._chunks is None:
                return 0, end - start  # fdatasync'd before it was recorded; the whole-file check covers it
            kept = _pread(self._fd, start, end)
            try:
                self._chunks.check(self._name, index, kept)
                return 0, end - start
            except IntegrityCheckError as err:
                logger.info("a resumed chunk no longer matches, fetching it again: %s", err)
            del kept
        data = self._read(start, end)
        if len(data) != end - start:
            raise IntegrityCheckError(
                f"{self._name}: bytes {start}-{end - 1} came back as {len(data)} bytes: the source is not the blob"
            )
        if self._chunks is not None:
            self._chunks.check(self._name, index, data)
        _pwrite(self._fd, data, start)
        if self._chunks is None:
            os.fdatasync(self._fd)  # durable before it is recorded: nothing re-verifies it on resume
        with self._lock:
            os.write(self._record, f"{index}\n".encode("ascii"))
        return end - start, 0


def _pread(fd: int, start: int, end: int) -> memoryview:
    buffer = bytearray(end - start)
    view = memoryview(buffer)
    filled = 0
    while filled < len(view):
        n = os.preadv(fd, [view[filled:]], start + filled)
        if n == 0:
            raise OSError(f"the resume state's data ends at {start + filled}, before {end}")
        filled += n
    return view


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    written = 0
    while written < len(data):
        written += os.pwrite(fd, data[written:], offset + written)


def _preallocate(fd: int, size: int, path: Path) -> None:
    """Reserve `size` bytes for the data, so a full disk fails now, not part way."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as err:
        if err.errno == 28:  # ENOSPC
            raise StoreError(f"no room for {size} bytes at {path}: {err.strerror}") from err
        os.ftruncate(fd, size)  # a filesystem that cannot reserve: the size alone


def _check_whole(fd: int, name: str, sha256: str) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    with open(fd, "rb", buffering=0, closefd=False) as stream:
        got = hash_stream(stream, hasher=StreamHasher(with_blake3=False)).sha256
    if got != sha256:
        raise IntegrityCheckError(f"{name}: the fetched bytes hash to sha256 {got}, not the recorded {sha256}")


def _still_named(fd: int, path: Path) -> bool:
    """Whether `path` still names the file open at `fd` (a removed or replaced state does not)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


def _unless_gone(_function: object, _path: str, exc_info: tuple[type, BaseException, object]) -> None:
    """rmtree's error handler: an entry removed meanwhile is no error."""
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]
