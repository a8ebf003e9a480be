"""Blobs in S3-compatible object storage, through obstore (a `core.blobbackend.BlobBackend`).

Keys: `<prefix>/objects/sha256/<2 hex>/<sha256>`, the local layout below the bucket's prefix. Each
object carries its digest as user metadata (`x-amz-meta-sha256`), a claim no check trusts.

Publishing (docs/store.md says what each path guarantees):

- a blob up to `multipart_threshold` bytes is one conditional PUT (`mode="create"`, S3's
  `If-None-Match: *`): atomic, and refused where the key exists; the existing object is then checked;
- a larger blob is first looked up (HEAD): an existing object is checked; an absent one is sent as a
  multipart upload in `chunk_bytes` parts. obstore cannot make a multipart upload conditional (a put
  with a mode other than overwrite is always a single PUT, held in memory whole, and S3 caps a single
  PUT at 5 GiB), so here "never overwrite" holds against everything but an upload of the same key
  racing this one, and that key's bytes are the same verified bytes: the name is their digest. A
  multipart upload is invisible until it completes; one that dies part way (a killed client or
  server) leaves parts the bucket's lifecycle rule for incomplete multipart uploads removes, and
  never a visible object.
- an existing object is checked by its bytes (one GET, hashed as it streams: a re-publish costs one
  read of the object), never by its size and claimed digest alone. One that is the blob is kept; one
  that is not (tampered, truncated, another size) is replaced by the publisher's verified bytes,
  conditionally on the ETag that was hashed (`If-Match`; above the threshold, the ETag looked up
  again just before the multipart upload), so an object someone changed meanwhile is checked again
  rather than clobbered.

Reading: `read_blob` streams a whole object (one GET); `read_range` is one ranged GET, the unit of a
parallel, resumable fetch (core.rangedfetch, `range_concurrency` = ENGINECACHE_STORE_CONCURRENCY at
once, all through this store's one client).

An existing object that is not the blob and changes under every try to replace it (REPLACE_TRIES), or
that the server gives no ETag, is IntegrityCheckError. Every other failure (the server refuses our
credentials, is unreachable, errs) is StoreError, one line naming the key and the server's answer.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, PreconditionError
from obstore.store import S3Store

from enginecache.core import processes
from enginecache.core.blobbackend import BlobSink
from enginecache.core.blobpaths import is_digest
from enginecache.core.hashing import CHUNK_BYTES, StreamHasher
from enginecache.core.storeconfig import S3Settings
from enginecache.core.storeenv import STORE_ENV
from enginecache.errors import IntegrityCheckError, StoreError

if TYPE_CHECKING:
    from obstore import Attributes, UpdateVersion
    from obstore.store import ClientConfig, RetryConfig

logger = logging.getLogger(__name__)

DIGEST_ATTRIBUTE = "sha256"  # user metadata: x-amz-meta-sha256
CONTENT_TYPE = "application/octet-stream"
# What obstore raises: its own BaseError tree, and for some operations a built-in ValueError or
# OSError. A missing object is the built-in FileNotFoundError (an OSError: caught before these).
FAILURES = (BaseError, OSError, ValueError)
# obstore runs a tokio runtime, threads of its own a fork does not copy (core.processes).
CLIENT_THREADS = "the S3 client (obstore's tokio runtime)"


REPLACE_TRIES = 3  # checks and conditional replaces of an object that is not the blob, before giving up
_NO_SUCH_BUCKET = "NoSuchBucket"  # S3's error code for a bucket that does not exist
_DEBUG_SOURCE = "Debug source:"  # where obstore's report turns into its Rust error's dump


def one_line(err: BaseException) -> str:
    """obstore's error as one line: its summary (the request, the retries, the server's answer or the
    connection's failure), without the multi-line dump of the client's internals that follows."""
    summary = str(err).split(_DEBUG_SOURCE, 1)[0]
    return " ".join(summary.split()) or type(err).__name__


def blob_key(sha256: str) -> str:
    """The key of a blob below the store's prefix (the local layout: core.blobpaths)."""
    if not is_digest(sha256):
        raise StoreError(f"not a sha256 digest: {sha256!r}")
    return f"objects/sha256/{sha256[:2]}/{sha256}"


class S3BlobStore:
    """Blobs in one bucket below one prefix (the endpoint, region and keys of `settings`)."""

    def __init__(self, settings: S3Settings) -> None:
        forked_from = processes.threads_started_before_fork(CLIENT_THREADS)
        if forked_from is not None:
            raise StoreError(
                f"the S3 client cannot run in this process: it is a fork of process {forked_from}, where the "
                "client's runtime had started its threads (a fork does not copy them); start this work in a new "
                "process instead"
            )
        processes.started_threads(CLIENT_THREADS)
        self.settings = settings
        client: ClientConfig = {"allow_http": settings.allow_http}
        retry: RetryConfig = {}
        if settings.retry_seconds is not None:
            retry["retry_timeout"] = timedelta(seconds=settings.retry_seconds)
        given = {
            "endpoint": settings.endpoint,
            "region": settings.region,
            "access_key_id": settings.access_key_id,
            "secret_access_key": settings.secret_access_key,
            "session_token": settings.session_token,
        }
        options: dict[str, Any] = {name: value for name, value in given.items() if value}
        try:
            self._store = S3Store(
                settings.bucket,
                prefix=settings.prefix or None,
                client_options=client,
                retry_config=retry or None,
                **options,
            )
        except FAILURES as err:  # a configuration obstore refuses (a malformed endpoint, region)
            raise StoreError(f"could not open {settings.url}: {err}") from err

    def _failure(self, action: str, key: str, err: BaseException) -> StoreError:
        """One line a pager can read: what failed, the key, the endpoint and the server's answer; the
        client's whole report is logged at INFO (`--verbose`)."""
        logger.info("%s %s failed: %s", action, self._where(key), err)
        if _NO_SUCH_BUCKET in str(err):
            return self._missing_bucket()
        return StoreError(f"could not {action} {self._where(key)} ({self._endpoint()}): {one_line(err)}")

    def _missing_bucket(self) -> StoreError:
        return StoreError(
            f"bucket {self.settings.bucket!r} does not exist at {self._endpoint()}: check {STORE_ENV} "
            "(s3://bucket/prefix) and the endpoint"
        )

    def _endpoint(self) -> str:
        return self.settings.endpoint or f"AWS S3 {self.settings.region or 'us-east-1'}"

    def describe(self) -> str:
        where = f" at {self.settings.endpoint}" if self.settings.endpoint else ""
        return f"{self.settings.url}{where}"

    def _where(self, key: str) -> str:
        return f"{self.settings.url.rstrip('/')}/{key}"

    # -- the interface ----------------------------------------------------------------

    def stat_blob(self, sha256: str) -> int | None:
        key = blob_key(sha256)
        try:
            return int(obstore.head(self._store, key)["size"])
        except FileNotFoundError:
            return None
        except FAILURES as err:
            raise self._failure("look up", key, err) from err

    def put_blob(self, sha256: str, source: Path, size: int) -> bool:
        key = blob_key(sha256)
        if size <= self.settings.multipart_threshold:
            if self._create(key, sha256, source, size):
                return True
            return self._keep_or_replace(key, sha256, source, size)
        if self.stat_blob(sha256) is not None:
            return self._keep_or_replace(key, sha256, source, size)
        self._upload_parts(key, sha256, source, size)
        return True

    def _upload_parts(self, key: str, sha256: str, source: Path, size: int) -> None:
        """`source` as a multipart upload in `chunk_bytes` parts (overwriting: obstore cannot make
        one conditional)."""
        try:
            obstore.put(
                self._store,
                key,
                source,
                attributes=self._attributes(sha256),
                use_multipart=True,
                chunk_size=self.settings.chunk_bytes,
                max_concurrency=self.settings.max_concurrency,
            )
        except FAILURES as err:
            raise self._failure(f"upload ({size} bytes)", key, err) from err
        logger.debug("uploaded blob %s (%d bytes) to %s in parts", sha256, size, self._where(key))

    def read_blob(self, sha256: str, sink: BlobSink, *, size: int | None = None) -> None:
        key = blob_key(sha256)
        try:
            result = obstore.get(self._store, key)
        except FileNotFoundError as err:
            if _NO_SUCH_BUCKET in str(err):
                raise self._missing_bucket() from err
            raise IntegrityCheckError(f"blob {sha256} is missing from {self.describe()}") from err
        except FAILURES as err:
            raise self._failure("download", key, err) from err
        stored = int(result.meta["size"])
        if size is not None and stored != size:
            raise IntegrityCheckError(f"{self._where(key)} is {stored} bytes, recorded {size}: it is not blob {sha256}")
        chunks = iter(result.stream(min_chunk_size=CHUNK_BYTES))
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                return
            except FAILURES as err:  # the connection cut part way: the sink's own errors are its own
                raise self._failure("download", key, err) from err
            sink(memoryview(chunk))

    @property
    def range_concurrency(self) -> int:
        """Ranged reads in flight at once for one fetch (ENGINECACHE_STORE_CONCURRENCY)."""
        return self.settings.max_concurrency

    def read_range(self, sha256: str, start: int, end: int) -> memoryview:
        """Bytes [start, end) of the stored blob: one ranged GET through this store's client, the
        bytes as obstore received them (no copy). A range past the object's end comes back short."""
        key = blob_key(sha256)
        try:
            return memoryview(obstore.get_range(self._store, key, start=start, end=end))
        except FileNotFoundError as err:
            if _NO_SUCH_BUCKET in str(err):
                raise self._missing_bucket() from err
            raise IntegrityCheckError(f"blob {sha256} is missing from {self.describe()}") from err
        except FAILURES as err:
            raise self._failure(f"download bytes {start}-{end - 1} of", key, err) from err

    # -- checking an object that is there already, and replacing it where it is not the blob ------

    def _keep_or_replace(self, key: str, sha256: str, source: Path, size: int) -> bool:
        """The object at `key` is kept where its bytes hash to `sha256` (its size and its claimed
        digest are not trusted: one GET, hashed as it streams); otherwise it is replaced by `source`,
        conditionally on the ETag that was hashed, so a writer that changed it meanwhile is not
        clobbered (its object is checked in turn). Returns whether it wrote."""
        for _ in range(REPLACE_TRIES):
            found = self._hash_existing(key)
            if found is None:  # removed since it was seen: uploaded as an absent blob would be
                if size > self.settings.multipart_threshold:
                    self._upload_parts(key, sha256, source, size)
                    return True
                if self._create(key, sha256, source, size):  # one that loses a race checks again
                    return True
                continue
            stored, got, e_tag, version = found
            if stored == size and got == sha256:
                return False
            logger.warning(
                "%s is not blob %s (%d bytes hashing to %s): replacing it with the verified blob",
                self._where(key),
                sha256,
                stored,
                got,
            )
            if self._replace(key, sha256, source, size, e_tag, version):
                return True
        raise IntegrityCheckError(
            f"{self._where(key)} is not blob {sha256} and changed under each of {REPLACE_TRIES} tries to replace it"
        )

    def _hash_existing(self, key: str) -> tuple[int, str, str | None, str | None] | None:
        """(size, sha256 of its bytes, ETag, version) of the object at `key`; None where there is none."""
        try:
            result = obstore.get(self._store, key)
            hasher = StreamHasher(with_blake3=False)
            for chunk in result.stream(min_chunk_size=CHUNK_BYTES):
                hasher.update(memoryview(chunk))
        except FileNotFoundError:
            return None
        except FAILURES as err:
            raise self._failure("check the existing", key, err) from err
        meta = result.meta
        return int(meta["size"]), hasher.result().sha256, meta.get("e_tag"), meta.get("version")

    def _attributes(self, sha256: str) -> Attributes:
        return {"Content-Type": CONTENT_TYPE, DIGEST_ATTRIBUTE: sha256}

    def _create(self, key: str, sha256: str, source: Path, size: int) -> bool:
        """One conditional create (`If-None-Match: *`); False where the key exists."""
        try:
            obstore.put(self._store, key, source, mode="create", attributes=self._attributes(sha256))
        except (AlreadyExistsError, PreconditionError):
            return False
        except FAILURES as err:
            raise self._failure(f"upload ({size} bytes)", key, err) from err
        return True

    def _replace(self, key: str, sha256: str, source: Path, size: int, e_tag: str | None, version: str | None) -> bool:
        """Replace the object whose ETag was `e_tag` by `source`; False where it changed meanwhile.

        Up to `multipart_threshold` bytes: one PUT with `If-Match` on that ETag, atomic. Larger: obstore
        cannot make a multipart upload conditional, so the ETag is looked up again just before an
        overwriting multipart upload; the window between is a race only with another writer of the same
        key, and whatever it wrote, this writes the verified blob over it."""
        if e_tag is None:
            raise IntegrityCheckError(
                f"{self._where(key)} is not blob {sha256} and the server gives it no ETag to replace it "
                "conditionally: remove it from the bucket and publish again"
            )
        if size <= self.settings.multipart_threshold:
            mode: UpdateVersion = {"e_tag": e_tag}
            if version is not None:
                mode["version"] = version
            try:
                obstore.put(self._store, key, source, mode=mode, attributes=self._attributes(sha256))
            except (PreconditionError, FileNotFoundError):
                return False
            except FAILURES as err:
                raise self._failure(f"replace ({size} bytes)", key, err) from err
            return True
        try:
            now = obstore.head(self._store, key).get("e_tag")
        except FileNotFoundError:
            return False
        except FAILURES as err:
            raise self._failure("look up", key, err) from err
        if now != e_tag:
            return False
        self._upload_parts(key, sha256, source, size)
        return True
