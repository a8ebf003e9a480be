"""The content-addressed artifact store.

Layout under `home`:
- `objects/sha256/<2 hex>/<digest>`: engine blobs, named by the sha256 of their bytes.
- `models/<digest>/<file names>`: ONNX bundles (model plus external data files, keeping the
  relative names the model refers to), named by the model digest (core.onnx_info).
- `tmp/`: work space on the same filesystem, so a finished file is published by a rename.
- `gc.lock`: the lock that keeps `enginecache gc` (service.maintenance.gc.collect) and publishing apart.

Writes go to a temp file while the bytes are hashed, are fsynced, then published with
`os.link` (which never replaces an existing name) or `os.replace` for a whole directory, and
the parent directory is fsynced. Nothing is ever overwritten: publishing bytes that already
exist keeps the existing copy, unless that copy no longer hashes to its name (damaged on disk),
in which case the fresh bytes, hashed as they were written, replace it.

Publishing and gc: a blob or bundle is published first and referenced by a catalog row a moment
later, so for that moment nothing in the catalog names it. Giving a blob or bundle its name (the
link, the rename, or finding it already there) happens under `publish_lock`, a shared `flock` on
`gc.lock`, and sets its mtime to now (an existing one is touched); gc holds the same lock exclusive
(`gc_lock`) while it reads the catalog's references and removes what nothing references, and it
never removes a blob or bundle younger than its age threshold. So gc either runs wholly before a
publish (which then writes the name anew) or wholly after it (and finds it fresh). The shared lock
costs a publish an open, a flock and a close; publishers never wait for each other.

A remote store (`ENGINECACHE_STORE=s3://bucket/prefix`, core.storeconfig; docs/store.md): the local
folder stays the verified cache every read goes through, and `remote` is a second backend of the same
interface (core.blobbackend). `write_blob` and `ingest_file` give the remote the blob, from the
hashed temp file, before it gets its local name: a publish that returns has put the blob in both, and
one that raises StoreError (the remote unreachable, refusing) has published nothing. `fetch_blob`
makes a blob the catalog records present locally, from the remote, verified in the pass that writes
it: the same temp file, hash and link as any publish, so a mismatch leaves nothing and raises
IntegrityCheckError. No remote call is made under `publish_lock`: gc never waits for the network.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from enginecache.core import chunkdigests
from enginecache.core.blobpaths import BLOB_FOLDER, is_digest
from enginecache.core.blobpaths import blob_path as digest_blob_path
from enginecache.core.hashing import CHUNK_BYTES, DigestResult, StreamHasher, check_file, copy_hashed, hash_file
from enginecache.core.storelock import StoreLock
from enginecache.errors import IntegrityCheckError, StoreError

if TYPE_CHECKING:
    from enginecache.core.blobbackend import BlobBackend, BlobSink

logger = logging.getLogger(__name__)

GC_LOCK_NAME = "gc.lock"


@dataclass(frozen=True)
class Fetched:
    """A blob made present by `ArtifactStore.fetch`: its path, the bytes read from the source by
    this call (0: it was here), and those a killed fetch had left that were kept."""

    path: Path
    fetched_bytes: int
    resumed_bytes: int


@dataclass(frozen=True)
class BlobInfo:
    """A blob that is durable in the store."""

    sha256: str
    blake3: str
    size: int
    path: Path
    created: bool  # False when identical bytes were already stored
    head_blake3: str = ""  # BLAKE3 of the first core.hashing.HEAD_BYTES bytes (an engine's header)
    chunk_blake3: str = ""  # BLAKE3 of each chunk, encoded by core.chunkdigests ("" for one chunk or less)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HashingWriter:
    """A binary file-like sink that hashes what it writes."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.hasher = StreamHasher()

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self._stream.write(data)
        self.hasher.update(data)
        return len(data)


class _Remote(enum.Enum):
    FROM_ENV = "from the environment"


FROM_ENV = _Remote.FROM_ENV  # ArtifactStore's default remote: ENGINECACHE_STORE, read on first use

Fill = Callable[[HashingWriter], None]


class ArtifactStore:
    """Blobs and model bundles under one home directory (and blobs in a remote, where one is set)."""

    def __init__(
        self, home: Path, *, tmp_dir: Path | None = None, remote: BlobBackend | _Remote | None = FROM_ENV
    ) -> None:
        self.home = home
        self.objects_dir = home / BLOB_FOLDER
        self.models_dir = home / "models"
        self.tmp_dir = tmp_dir or home / "tmp"  # must be on the same filesystem as objects/
        self._remote = remote
        self._lock = StoreLock(home / GC_LOCK_NAME)

    @property
    def remote(self) -> BlobBackend | None:
        """The remote blob store publishes also go to, None for the local folder only. By default
        the environment's (core.storeconfig), resolved on first use: a store that publishes nothing
        never parses it, and one without a remote imports no client."""
        if self._remote is FROM_ENV:
            self._remote = remote_from_env()
        return self._remote

    def ensure(self) -> None:
        for path in (self.objects_dir, self.models_dir, self.tmp_dir):
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as err:  # disk full, read-only, permissions: the store, not the request
                raise StoreError(f"could not create the store's folder {path}: {err}") from err

    def _mkdtemp(self, prefix: str) -> Path:
        try:
            return Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmp_dir))
        except OSError as err:
            raise StoreError(f"could not make a temporary folder in {self.tmp_dir}: {err}") from err

    # -- publishing and gc --------------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return self._lock.path

    def publish_lock(self) -> contextlib.AbstractContextManager[None]:
        """Held while a blob or bundle gets its name: shared, so only `gc_lock` waits for it."""
        return self._lock.hold(exclusive=False)

    def gc_lock(self) -> contextlib.AbstractContextManager[None]:
        """Held by gc while it decides and removes: it waits for every publish under way, and each
        publish that starts meanwhile waits for it."""
        return self._lock.hold(exclusive=True)

    # -- engine blobs -------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        if not is_digest(sha256):
            raise StoreError(f"not a sha256 digest: {sha256!r}")
        return digest_blob_path(self.home, sha256)

    def relative(self, path: Path) -> str:
        return path.relative_to(self.home).as_posix()

    @contextlib.contextmanager
    def temp_dir(self, prefix: str = "work-") -> Iterator[Path]:
        """A scratch directory on the store's filesystem, removed afterwards."""
        self.ensure()
        path = self._mkdtemp(prefix)
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)

    def write_blob(self, chunks: Sequence[bytes | bytearray | memoryview] | memoryview) -> BlobInfo:
        """Write bytes (a buffer or a sequence of buffers) as a new blob (and to the remote)."""
        parts = [chunks] if isinstance(chunks, memoryview) else list(chunks)

        def fill(writer: HashingWriter) -> None:
            for part in parts:
                view = memoryview(part).cast("B")
                for start in range(0, len(view), CHUNK_BYTES):
                    writer.write(view[start : start + CHUNK_BYTES])

        return self._publish(fill)

    def ingest_file(self, source: Path) -> BlobInfo:
        """Copy a file into the store (and to the remote) while hashing it."""
        return self._publish(_copy_from(source))

    def fetch_blob(self, sha256: str, *, size: int | None = None, source: BlobBackend | None = None) -> Path:
        """The local path of blob `sha256`, fetched where it is not here (`fetch`, which says what
        is verified and what is raised)."""
        return self.fetch(sha256, size=size, source=source).path

    def fetch(
        self,
        sha256: str,
        *,
        size: int | None = None,
        chunk_blake3: str | None = None,
        source: BlobBackend | None = None,
        mode: int | None = None,
    ) -> Fetched:
        """Make blob `sha256` present here: at once where it is stored already (the read that uses it
        verifies it); else read from `source` (default: the remote) by byte ranges, in parallel,
        verified and resumable (core.rangedfetch: chunk by chunk against `chunk_blake3`, the recorded
        chunk digests, else the whole file against `sha256`), and given its name (with `mode`, where
        given) only once it is whole. `size`, the recorded size, refuses an object of another size
        before any byte is read. A fetch killed part way leaves its resume state in `tmp/`, and the
        next fetch of the blob reads only what it lacks; nothing else is left.

        IntegrityCheckError: the blob is in neither place, or the source's bytes are not the blob
        (naming the chunk where chunk digests are recorded; the resume state is removed); StoreError:
        the source cannot be reached or read (the resume state is kept), or this store not written."""
        path = self.blob_path(sha256)
        if path.is_file():
            return Fetched(path, 0, 0)
        origin = source if source is not None else self.remote
        if origin is None:
            raise IntegrityCheckError(f"blob {sha256} is missing from {path.parent} and no remote store is set")
        chunks = chunkdigests.decode(chunk_blake3)
        stored = origin.stat_blob(sha256)
        if stored is None:
            origin.read_range(sha256, 0, 1)  # its answer says what is missing: the blob, or the bucket
            raise IntegrityCheckError(f"blob {sha256} is missing from {origin.describe()}")
        if size is not None and stored != size:
            raise IntegrityCheckError(f"blob {sha256} is {stored} bytes in {origin.describe()}, recorded {size}")
        name = f"blob {sha256} from {origin.describe()}"
        from enginecache.core import rangedfetch  # its threads and locks: only a fetch pays for them

        try:
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            with rangedfetch.hold_state(rangedfetch.state_folder(self.tmp_dir, sha256)) as state:
                if path.is_file():  # fetched by another process while this one waited for the state
                    state.remove()
                    return Fetched(path, 0, 0)
                try:
                    got = state.fill(
                        functools.partial(origin.read_range, sha256),
                        name=name,
                        sha256=sha256,
                        size=stored,
                        chunks=chunks,
                        concurrency=origin.range_concurrency,
                    )
                except IntegrityCheckError:
                    state.remove()  # the source's bytes are wrong: reading them again reads the same
                    raise
                if mode is not None:
                    os.chmod(state.data, mode)
                self._adopt_fetched(state.data, path, sha256)
                state.remove()
        except OSError as err:
            raise StoreError(f"could not fetch blob {sha256} into {self.home}: {err}") from err
        logger.info(
            "fetched blob %s (%d bytes, %d of them kept from a killed fetch) from %s",
            sha256,
            stored,
            got.resumed_bytes,
            origin.describe(),
        )
        return Fetched(path, got.fetched_bytes, got.resumed_bytes)

    def _adopt_fetched(self, data: Path, final: Path, sha256: str) -> None:
        """Give fetched, verified bytes their name, as a publish does (under `publish_lock`, never
        replacing a sound copy)."""
        if not final.parent.is_dir():
            final.parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.objects_dir)
        with self.publish_lock():
            try:
                os.link(data, final)
            except FileExistsError:
                if not self._repair_if_damaged(data, final, sha256):
                    os.utime(final)
        fsync_dir(final.parent)

    def _publish(self, fill: Fill, *, expect: str | None = None, mirror: bool = True) -> BlobInfo:
        """Write `fill`'s bytes to a temp file while hashing them; refuse them unless they hash to
        `expect` (where given); give them to the remote (where `mirror`); then give them their name."""
        self.ensure()
        fd, temp_name = tempfile.mkstemp(prefix="blob-", suffix=".partial", dir=self.tmp_dir)
        temp = Path(temp_name)
        try:
            with os.fdopen(fd, "wb") as stream:
                writer = HashingWriter(stream)
                fill(writer)
                stream.flush()
                os.fsync(stream.fileno())
            digest = writer.hasher.result()
            if expect is not None and digest.sha256 != expect:
                raise IntegrityCheckError(f"the bytes written as blob {expect} hash to {digest.sha256}: refused")
            return self._name(temp, digest, mirror=mirror)
        except OSError as err:
            raise StoreError(f"could not write blob into {self.objects_dir}: {err}") from err
        finally:
            temp.unlink(missing_ok=True)

    def publish_hashed(self, path: Path, digest: DigestResult) -> BlobInfo:
        """Publish a file already on disk (fsynced) in this store's tmp/ (the same filesystem as
        objects/), whose digests the caller has just computed from its bytes (a job's staged engine,
        verified by its hash pass: service.builds.stagedengine): to the remote, then its name, by a
        hard link, as `ingest_file` does with the copy it hashes, without copying it. The file keeps
        its own name too; removing it later leaves the blob."""
        try:
            return self._name(path, digest, mirror=True)
        except OSError as err:
            raise StoreError(f"could not publish {path} into {self.objects_dir}: {err}") from err

    def _name(self, temp: Path, digest: DigestResult, *, mirror: bool) -> BlobInfo:
        """Give hashed, durable bytes at `temp` to the remote (where `mirror`) and then their name,
        under `publish_lock`, never replacing a sound copy; the name's mtime is now (young to gc)."""
        remote = self.remote if mirror else None
        if remote is not None:
            remote.put_blob(digest.sha256, temp, digest.size)  # before the name: both, or neither
        final = self.blob_path(digest.sha256)
        if not final.parent.is_dir():
            final.parent.mkdir(parents=True, exist_ok=True)
            fsync_dir(self.objects_dir)
        with self.publish_lock():
            try:
                os.link(temp, final)
                created = True
            except FileExistsError:
                created = self._repair_if_damaged(temp, final, digest.sha256)
            os.utime(final)  # published (again) now: young to gc, whenever its bytes were written
        fsync_dir(final.parent)
        return BlobInfo(
            digest.sha256, digest.blake3, digest.size, final, created, digest.head_blake3, digest.chunk_blake3
        )

    def _repair_if_damaged(self, temp: Path, final: Path, sha256: str) -> bool:
        """Identical bytes are already stored: keep them, unless they no longer hash to their name
        (a damaged copy); then the fresh, verified bytes replace it. Returns whether it wrote."""
        if hash_file(final).sha256 == sha256:
            return False
        logger.warning("blob %s was damaged on disk; replacing it with freshly written bytes", sha256)
        os.replace(temp, final)
        return True

    def verify_blob(self, sha256: str) -> DigestResult:
        """Re-hash a blob in one pass; raise IntegrityCheckError on mismatch or absence."""
        path = self.blob_path(sha256)
        if not path.is_file():
            raise IntegrityCheckError(f"blob {sha256} is missing from {path.parent}")
        return check_file(path, sha256=sha256)

    # -- the blob backend interface (core.blobbackend), local folder only ---------------

    def describe(self) -> str:
        return str(self.objects_dir)

    def stat_blob(self, sha256: str) -> int | None:
        try:
            return self.blob_path(sha256).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as err:
            raise StoreError(f"could not look up blob {sha256} in {self.objects_dir}: {err}") from err

    def put_blob(self, sha256: str, source: Path, size: int) -> bool:
        """Store `source` here only (not mirrored): refused unless its bytes hash to `sha256`."""
        info = self._publish(_copy_from(source), expect=sha256, mirror=False)
        if info.size != size:
            raise IntegrityCheckError(f"blob {sha256} is {info.size} bytes, the caller said {size}")
        return info.created

    @property
    def range_concurrency(self) -> int:
        return min(8, os.cpu_count() or 1)

    def read_range(self, sha256: str, start: int, end: int) -> memoryview:
        path = self.blob_path(sha256)
        buffer = bytearray(end - start)
        view = memoryview(buffer)
        filled = 0
        try:
            with open(path, "rb", buffering=0) as stream:
                while filled < len(view) and (n := os.preadv(stream.fileno(), [view[filled:]], start + filled)):
                    filled += n
        except FileNotFoundError as err:
            raise IntegrityCheckError(f"blob {sha256} is missing from {path.parent}") from err
        except OSError as err:
            raise StoreError(f"could not read blob {path}: {err}") from err
        return view[:filled]

    def read_blob(self, sha256: str, sink: BlobSink, *, size: int | None = None) -> None:
        path = self.blob_path(sha256)
        try:
            with open(path, "rb", buffering=0) as stream:
                stored = os.fstat(stream.fileno()).st_size
                if size is not None and stored != size:
                    raise IntegrityCheckError(f"blob {path} is {stored} bytes, recorded {size}")
                buffer = bytearray(CHUNK_BYTES)
                view = memoryview(buffer)
                while n := stream.readinto(view):
                    sink(view[:n])
        except FileNotFoundError as err:
            raise IntegrityCheckError(f"blob {sha256} is missing from {path.parent}") from err
        except OSError as err:
            raise StoreError(f"could not read blob {path}: {err}") from err

    # -- model bundles ------------------------------------------------------------------

    def model_dir(self, digest: str) -> Path:
        return self.models_dir / digest

    def put_model_bundle(
        self,
        model_path: Path,
        external_files: Sequence[str],
        digest: str,
        *,
        digests: dict[str, DigestResult] | None = None,
    ) -> Path:
        """Copy a model and its external data files (relative names kept) into `models/<digest>/`.

        Returns the stored model file's path. An existing bundle with that digest is kept as is.
        With `digests`, each file is hashed in the pass that copies it and its digest put there under
        its name (for the remote's upload, which then hashes nothing again); an existing bundle adds none.
        """
        self.ensure()
        target = self.model_dir(digest)
        stored_model = target / model_path.name
        if self._touch_bundle(target):
            return stored_model
        staging = self._mkdtemp("model-")
        try:
            names = [model_path.name, *external_files]
            for name in names:
                source = model_path.parent / name
                dest = staging / name
                dest.parent.mkdir(parents=True, exist_ok=True)
                if digests is None:
                    shutil.copyfile(source, dest)  # the kernel's copy: no byte through this process
                else:
                    digests[name] = copy_hashed(source, dest)
                with open(dest, "rb") as stream:
                    os.fsync(stream.fileno())
            self.adopt_bundle(staging, digest)
            return stored_model
        except OSError as err:
            raise StoreError(f"could not store model bundle {digest}: {err}") from err
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def adopt_bundle(self, staging: Path, digest: str) -> Path:
        """Give a complete staged bundle folder its name, `models/<digest>/` (one stored meanwhile by
        another process is kept, and `staging` left to its owner to remove); fsynced. OSError if
        neither happened."""
        target = self.model_dir(digest)
        fsync_dir(staging)
        with self.publish_lock():
            try:
                os.rename(staging, target)
            except OSError:
                if not target.is_dir():
                    raise
                logger.debug("model bundle %s was stored concurrently; keeping that copy", digest)
            os.utime(target)  # young to gc from now, however long the copy took
        fsync_dir(self.models_dir)
        return target

    def _touch_bundle(self, target: Path) -> bool:
        """Whether the bundle is stored already; if so it is touched (young to gc, see above)."""
        try:
            with self.publish_lock():
                if not target.is_dir():
                    return False
                os.utime(target)
        except OSError as err:
            raise StoreError(f"could not use the stored model bundle {target}: {err}") from err
        return True


def remote_from_env() -> BlobBackend | None:
    """The remote of this process's environment (core.storeconfig), opened, not yet contacted; None
    for the local folder only. The S3 client is imported here, and only where one is configured."""
    from enginecache.core.storeconfig import s3_settings

    settings = s3_settings()
    if settings is None:
        return None
    from enginecache.core.objectstore import S3BlobStore

    return S3BlobStore(settings)


def _copy_from(source: Path) -> Fill:
    """A fill that copies `source`, a chunk at a time."""

    def fill(writer: HashingWriter) -> None:
        buffer = bytearray(CHUNK_BYTES)
        view = memoryview(buffer)
        with open(source, "rb", buffering=0) as stream:
            while n := stream.readinto(view):
                writer.write(view[:n])

    return fill
