"""A disk budget for a folder of engine blobs laid out as the store lays them out
(`<root>/objects/sha256/<2 hex>/<sha256>`): the folder `enginecache pull --max-bytes N` fills
(docs/fleet.md), and the local cache of a remote store, `ENGINECACHE_STORE_CACHE_MAX_BYTES`
(docs/store.md). The one owner of what may be evicted, and in which order.

Contract:

- A loaded engine holds its blob (`BlobHold.take`): a read-only descriptor of its own with a shared
  `flock`, taken before the blob is read and kept until the engine is closed (or the process ends;
  the descriptor is close-on-exec). Taking it records the use: the blob's atime is set to now and
  its mtime kept (a serving state file compares the mtime). That is an open, a flock, an fstat and
  a futimens: no catalog, no file written, no `pathlib`. Where the times cannot be set (the blob is
  another user's, a read-only mount) the hold stands all the same.
- `evict` removes the blobs used least recently first: by the later of atime and mtime, so a blob
  never loaded counts from when it landed (pulled, fetched); ties by digest. The kernel's own atime
  update on a read counts as a use too. It stops as soon as what is left, plus `incoming` bytes
  about to land, fits the budget.
- It never removes: a blob a live process holds (it takes `LOCK_EX | LOCK_NB` on each and skips
  what it cannot lock; it unlinks while holding that lock, so a loader that gets its shared lock
  afterwards sees the link count 0 and knows the blob is gone); a blob any manifest in
  `<root>/manifests/*.json` names (so no manifest names a missing blob); a blob in `keep`; a blob
  `may_remove` refuses (the store's cache: one the remote does not hold, whose only copy it is).
  A manifest names its engine's blob, an engine bundle's files and its runtime cache. An engine
  bundle's folder (`<root>/bundles/<digest>/`, hard links of its files' blobs) that no manifest names
  is removed first, so evicting those blobs frees their space.
- What it cannot remove is reported (`EvictionReport.over_budget`, `in_use`), not raised: the
  budget is met once the holders close. A budget smaller than what must stay is an error before
  anything moves (`check_fits`).
- The caller holds `<root>/gc.lock` exclusive while it evicts (`folder_lock`), the lock whose
  shared side a publish (core.store) or a pull holds while a blob lands and gets named: an eviction
  never sees a blob that landed but is not named yet.

Light on purpose (what the cache hit has imported already, and fcntl; the rest where used): the
hit imports it for `BlobHold` and `fetch_within_budget`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time

from enginecache.core.blobpaths import BLOB_FOLDER, blob_file, is_digest
from enginecache.core.storeenv import configured
from enginecache.errors import BadInputError, StoreError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Mapping
    from typing import Any

STORE_CACHE_ENV = "ENGINECACHE_STORE_CACHE_MAX_BYTES"
BUNDLE_FOLDER = "bundles"  # service.fleet.pull lays a pulled engine bundle out as `<root>/bundles/<digest>/`
LOCK_NAME = "gc.lock"  # core.store.GC_LOCK_NAME: publishes hold it shared, gc and eviction exclusive
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str, name: str) -> int:
    """A size in bytes from `text`: an integer, or one followed by K, M, G or T (powers of 1024:
    `20G`). BadInputError, naming `name`, for anything else or for less than one byte."""
    raw = text.strip().upper()
    unit = raw[-1:] if raw[-1:] in _UNITS else ""
    digits = raw[: len(raw) - len(unit)]
    if not digits.isdigit():
        raise BadInputError(f"{name}={text!r} is not a size: give bytes, or a number with K, M, G or T (20G)")
    size = int(digits) * _UNITS[unit]
    if size < 1:
        raise BadInputError(f"{name}={text!r}: a disk budget must be at least 1 byte")
    return size


def store_cache_budget(env: Mapping[str, str] | None = None) -> int | None:
    """The store's local cache budget (`ENGINECACHE_STORE_CACHE_MAX_BYTES`), None where unset;
    StoreError for a value this version cannot use (as core.storeconfig's settings)."""
    raw = (os.environ if env is None else env).get(STORE_CACHE_ENV, "").strip()
    if not raw:
        return None
    try:
        return parse_size(raw, STORE_CACHE_ENV)
    except BadInputError as err:
        raise StoreError(str(err)) from err


class BlobHold:
    """A loaded engine's hold on its blob (module docstring): `take(path)` before the read, `close()`
    when the engine is closed. Closing twice is harmless; a hold dropped unclosed closes itself."""

    __slots__ = ("fd",)

    def __init__(self) -> None:
        self.fd = -1

    def take(self, path: str, *, now_ns: int | None = None) -> bool:
        """Hold `path` shared and record its use (atime `now_ns`, default now). False where it is not
        there: missing, or evicted while this waited for the lock (the caller fetches it again, or
        lets the read report it missing). A filesystem without flock holds nothing but says True."""
        self.close()
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False  # missing or unreadable: the read that follows says which
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while an eviction holds it to unlink it
            st = os.fstat(fd)
        except OSError:
            os.close(fd)
            return True
        if st.st_nlink == 0:
            os.close(fd)
            return False
        with contextlib.suppress(OSError):  # another user's blob, a read-only mount: held, ordered by its landing
            os.utime(fd, ns=(time.time_ns() if now_ns is None else now_ns, st.st_mtime_ns))
        self.fd = fd
        return True

    @property
    def held(self) -> bool:
        return self.fd >= 0

    def close(self, _close: Callable[[int], None] = os.close) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)  # the flock goes with the descriptor (os.close bound early: __del__ may run at exit)

    def __del__(self) -> None:
        self.close()


class BlobEntry:
    """A blob in the folder: its digest, path, size and last use (ns, the later of atime and mtime)."""

    __slots__ = ("last_used_ns", "path", "sha256", "size")

    def __init__(self, sha256: str, path: str, size: int, last_used_ns: int) -> None:
        self.sha256, self.path, self.size, self.last_used_ns = sha256, path, size, last_used_ns


def blob_entries(root: str) -> list[BlobEntry]:
    """Every blob under `<root>/objects/sha256/` (files named by a digest; anything else is left out)."""
    found: list[BlobEntry] = []
    try:
        with os.scandir(os.path.join(root, BLOB_FOLDER)) as top:
            shards = [e.path for e in top if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return found
    for shard in shards:
        try:
            listing = os.scandir(shard)
        except FileNotFoundError:
            continue
        with listing:
            for entry in listing:
                if not is_digest(entry.name) or not entry.is_file(follow_symlinks=False):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                found.append(BlobEntry(entry.name, entry.path, st.st_size, max(st.st_atime_ns, st.st_mtime_ns)))
    return found


def manifest_blobs(root: str, *, besides: str | None = None) -> dict[str, str]:
    """The blobs the manifests in `<root>/manifests/` name: digest -> the manifest's file name. A
    manifest names its engine's blob, each file of an engine bundle (`bundle.files`) and its runtime
    cache (`runtime_cache`). `besides` (a file name) is left out. A manifest that cannot be read names
    nothing a load could use, and is left out too."""
    folder = os.path.join(root, "manifests")
    named: dict[str, str] = {}
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return named
    for name in names:
        if name.startswith(".") or not name.endswith(".json") or name == besides:
            continue  # `.NAME.json.XXXX`: a manifest being written (pull renames it into place)
        try:
            with open(os.path.join(folder, name), "rb") as stream:
                data = json.load(stream)
            digests = [data["engine"]["sha256"]]
            digests += [entry["sha256"] for entry in (data.get("bundle") or {}).get("files", ())]
            digests.append((data.get("runtime_cache") or {}).get("sha256"))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        for digest in digests:
            if isinstance(digest, str) and is_digest(digest):
                named[digest] = name
    return named


def unnamed_bundle_folders(root: str, named: Collection[str]) -> list[str]:
    """The engine bundle folders `<root>/bundles/<digest>` (a pull lays them out from hard links of
    the blobs) whose digest no manifest names: while one stands, evicting its files' blobs frees no
    space. Hidden folders (a placement in progress) are left to the pull that owns them."""
    try:
        with os.scandir(os.path.join(root, BUNDLE_FOLDER)) as listing:
            return sorted(
                entry.path
                for entry in listing
                if is_digest(entry.name) and entry.name not in named and entry.is_dir(follow_symlinks=False)
            )
    except FileNotFoundError:
        return []


class EvictionReport:
    """What `evict` did: the budget, the total before and after, the blobs removed (digest, bytes) in
    the order removed, and those it would have removed but a live process holds (`in_use`)."""

    __slots__ = ("evicted", "in_use", "max_bytes", "total_after", "total_before")

    def __init__(self, max_bytes: int, total_before: int) -> None:
        self.max_bytes, self.total_before, self.total_after = max_bytes, total_before, total_before
        self.evicted: list[tuple[str, int]] = []
        self.in_use: list[str] = []

    @property
    def evicted_bytes(self) -> int:
        return sum(size for _digest, size in self.evicted)

    @property
    def over_budget(self) -> bool:
        return self.total_after > self.max_bytes

    def merge(self, later: EvictionReport) -> EvictionReport:
        """This report followed by `later` (a second pass over the same folder)."""
        merged = EvictionReport(later.max_bytes, self.total_before)
        merged.total_after = later.total_after
        merged.evicted = self.evicted + later.evicted
        merged.in_use = list(later.in_use)
        return merged

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_bytes": self.max_bytes,
            "bytes": self.evicted_bytes,
            "blobs": [{"sha256": digest, "bytes": size} for digest, size in self.evicted],
            "in_use": list(self.in_use),
            "total_bytes": self.total_after,
            "over_budget": self.over_budget,
        }

    def describe(self) -> str:
        """One line for people."""
        text = (
            f"evicted {len(self.evicted)} blob(s), {self.evicted_bytes} bytes; {self.total_after} of {self.max_bytes}"
        )
        if self.over_budget:
            held = f"{len(self.in_use)} blob(s) held by running processes" if self.in_use else "the rest may not go"
            text += f" bytes: over budget ({held})"
        else:
            text += " bytes used"
        return text


def check_fits(max_bytes: int, blobs: Mapping[str, int], *, others: Mapping[str, int], name: str) -> None:
    """BadInputError (naming the budget `name` and every size) where the engine's `blobs` (digest ->
    bytes: one blob, or an engine bundle's manifest and files), with the blobs in `others` that must
    stay beside them, do not fit `max_bytes`."""
    size = sum(blobs.values())
    what = f"blob ({next(iter(blobs))[:12]}, {size} bytes)" if len(blobs) == 1 else f"{len(blobs)} blobs ({size} bytes)"
    if size > max_bytes:
        raise BadInputError(
            f"{name} {max_bytes} is smaller than the engine's {what} alone: nothing was copied or removed"
        )
    kept = sum(bytes_ for digest, bytes_ in others.items() if digest not in blobs)
    if size + kept > max_bytes:
        raise BadInputError(
            f"{name} {max_bytes} cannot hold the engine's {what} beside the "
            f"{kept} bytes that must stay ({len(others)} blob(s) other manifests name): nothing was copied "
            "or removed; remove a manifest that is no longer served, or raise the budget"
        )


def blob_sizes(root: str, digests: Collection[str]) -> dict[str, int]:
    """The size of each of `digests` present under `root` (absent ones are left out)."""
    sizes: dict[str, int] = {}
    for digest in digests:
        try:
            sizes[digest] = os.stat(os.path.join(root, BLOB_FOLDER, digest[:2], digest)).st_size
        except FileNotFoundError:
            continue
    return sizes


class FolderLock:
    """`<root>/gc.lock` held shared (a blob landing and getting named) or exclusive (an eviction),
    released by `close()` (or the process's end)."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self, _close: Callable[[int], None] = os.close) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            _close(fd)

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def folder_lock(root: str, *, exclusive: bool) -> FolderLock:
    """`<root>/gc.lock` taken, waiting for it (the folder is made where missing). StoreError where it
    cannot be opened or locked."""
    return _lock(root, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)


def try_folder_lock(root: str) -> FolderLock | None:
    """`<root>/gc.lock` taken exclusive where no one holds it now, else None (no wait)."""
    try:
        return _lock(root, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None


def _lock(root: str, operation: int) -> FolderLock:
    """BlockingIOError where `operation` has LOCK_NB and another holds the lock."""
    path = os.path.join(root, LOCK_NAME)
    try:
        os.makedirs(root, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise StoreError(f"could not open the lock {path}: {err}") from err
    try:
        fcntl.flock(fd, operation)
    except BlockingIOError:
        os.close(fd)
        raise
    except OSError as err:
        os.close(fd)
        raise StoreError(f"could not lock {path}: {err}") from err
    return FolderLock(fd)


def evict(
    root: str,
    max_bytes: int,
    *,
    incoming: int = 0,
    keep: Collection[str] = (),
    may_remove: Callable[[str, int], bool] | None = None,
) -> EvictionReport:
    """Remove blobs under `root`, least recently used first, until the rest plus `incoming` bytes fit
    `max_bytes` (the module docstring says which never go). The caller holds `folder_lock(root,
    exclusive=True)`. StoreError where a blob cannot be removed."""
    import shutil

    named = manifest_blobs(root)
    for folder in unnamed_bundle_folders(root, named):  # before the blobs: its links would keep them on disk
        shutil.rmtree(folder, ignore_errors=True)
    entries = blob_entries(root)
    total = sum(entry.size for entry in entries)
    report = EvictionReport(max_bytes, total)
    target = max_bytes - incoming
    for entry in sorted(entries, key=lambda e: (e.last_used_ns, e.sha256)):
        if total <= target:
            break
        if entry.sha256 in keep or entry.sha256 in named:
            continue
        if may_remove is not None and not may_remove(entry.sha256, entry.size):
            continue
        if not _remove_unheld(entry.path):
            report.in_use.append(entry.sha256)
            continue
        total -= entry.size
        report.evicted.append((entry.sha256, entry.size))
    report.total_after = total
    return report


def _remove_unheld(path: str) -> bool:
    """Unlink `path` unless a process holds it (a shared flock): whether it is gone. The exclusive
    lock is held across the unlink, so a loader waiting for its shared lock then sees it gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError as err:
        raise StoreError(f"could not open {path} to evict it: {err}") from err
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            return False  # replaced under this name meanwhile: not the blob this decided on
        os.unlink(path)
        return True
    except FileNotFoundError:
        return True
    except OSError as err:
        raise StoreError(f"could not evict {path}: {err}") from err
    finally:
        os.close(fd)


class Landing:
    """One blob landing in `root` (a pull) within `max_bytes` (None: no budget): `admit` before
    anything is copied (the budget checked, room made, then `<root>/gc.lock` held shared so no
    eviction removes the blob before its manifest names it), `release` once the manifest is written,
    `finish` to evict down to the budget (it waits for pulls into `root` still landing). `name` is
    what the budget is called in an error (`--max-bytes`)."""

    __slots__ = ("_lock", "max_bytes", "name", "report", "root")

    def __init__(self, root: str, max_bytes: int | None, *, name: str) -> None:
        self.root, self.max_bytes, self.name = root, max_bytes, name
        self.report: EvictionReport | None = None
        self._lock: FolderLock | None = None

    def admit(self, blobs: Mapping[str, int], manifest_name: str) -> None:
        """BadInputError (nothing moved) where the engine's `blobs` (digest -> bytes: one blob, or an
        engine bundle's manifest and files) cannot fit beside the blobs the other manifests name; else
        room made for those not here yet (the least recently used blobs no manifest names go) and the
        folder held shared."""
        if self.max_bytes is not None:
            others = blob_sizes(self.root, manifest_blobs(self.root, besides=manifest_name))
            check_fits(self.max_bytes, blobs, others=others, name=self.name)
            present = blob_sizes(self.root, blobs)
            incoming = sum(size for digest, size in blobs.items() if digest not in present)
            with folder_lock(self.root, exclusive=True):
                self.report = evict(self.root, self.max_bytes, incoming=incoming, keep=set(blobs))
        self._lock = folder_lock(self.root, exclusive=False)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def finish(self) -> EvictionReport | None:
        """With a budget, what `admit` and this last pass evicted (None without one)."""
        self.release()
        if self.max_bytes is None or self.report is None:
            return None
        with folder_lock(self.root, exclusive=True):
            self.report = self.report.merge(evict(self.root, self.max_bytes))
        return self.report


def fetch_within_budget(home: str, sha256: str | None, *, chunk_blake3: str | None = None) -> None:
    """`core.blobfetch.fetch_if_missing` for a load, within `ENGINECACHE_STORE_CACHE_MAX_BYTES` where
    it is set: the blob's size asked of the remote, StoreError before anything is downloaded where
    the budget is smaller; then room made (blobs the remote holds, least recently used first: a blob
    whose only copy is here is never evicted), then the fetch (each chunk checked against
    `chunk_blake3` as it lands, where the row records it). An eviction another process is doing
    meanwhile is left to it. With the blob here or no remote: a stat, as `fetch_if_missing`."""
    file = blob_file(home, sha256)  # IntegrityCheckError for a value that is not a digest, remote or not
    if not configured() or os.path.isfile(file):
        return
    from enginecache.core.blobfetch import fetch_if_missing

    budget = store_cache_budget()
    if budget is None:
        fetch_if_missing(home, sha256, chunk_blake3=chunk_blake3)
        return
    import logging
    from pathlib import Path

    from enginecache.core.store import ArtifactStore

    digest = str(sha256)
    store = ArtifactStore(Path(home))
    remote = store.remote
    size = remote.stat_blob(digest) if remote is not None else None
    if remote is not None and size is not None:
        try:
            check_fits(budget, {digest: size}, others={}, name=STORE_CACHE_ENV)
        except BadInputError as err:
            raise StoreError(str(err)) from err
        lock = try_folder_lock(home)
        if lock is not None:
            with lock:
                report = evict(home, budget, incoming=size, may_remove=lambda d, s: remote.stat_blob(d) == s)
            if report.evicted or report.over_budget:
                logging.getLogger(__name__).info("store cache %s: %s", home, report.describe())
    fetch_if_missing(home, digest, size=size, chunk_blake3=chunk_blake3)
