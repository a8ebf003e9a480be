"""Loading one engine from the store: header check, verified read, the backend's load.

No catalog here (both `load_or_build` paths use it: the ORM one through `service.serving.loading`, the
stdlib-sqlite cache hit through `service.serving.hitpath`); what the catalog must do about a corrupt blob
is the caller's `on_corrupt(reason)`.

Order: the runtime's import (a missing library fails before anything is read); then, where this
host trusts signing keys, the engine's signed statement against its row and the caller's request
(`check_provenance`, core.signing: TAMPERED or UNTRUSTED before any byte is read); then, where the
catalog records the BLAKE3 of the blob's first ENGINE_HEADER_BYTES (`header_blake3`, written by the
store in the pass that hashes the whole blob), those bytes alone, read and verified, and the
backend's validity test on them (`Backend.check_header`: TensorRT-RTX's `get_engine_validity`, the
ORT-format identifier and version): an engine this host cannot run is INCOMPATIBLE without reading
or hashing the rest, which may be gigabytes. Then, under a read lease (`_load_in_place`,
`core.filelease`: no copy of ours), a runtime that reads files itself (`Backend.reads_files`: ONNX
Runtime) reads the blob once it was hashed where it lies, and any other (TensorRT) deserializes from
a read-only mapping of it hashed on every core (`core.verifiedread.map_file`). Where no lease
can be had or it broke, one pass reads the blob into the buffer the runtime gets while hashing it
(BLAKE3 where recorded, else sha256). `Backend.load` starts with the same validity test on the
verified bytes and then deserializes them. No byte
reaches a runtime, not even the header its validity test parses, before it matched a digest the
catalog records: a damaged header is CORRUPT, a damaged body is CORRUPT wherever the engine could
run (a host that refuses the header never looks at the body, and says INCOMPATIBLE). An engine
recorded without `header_blake3` (built before migration 0015) is read whole first, as before,
until `enginecache verify` records it.
The read does not overlap the runtime's import: on these machines the two contend for the memory
system and the start was no faster.

The blob is read from the path its sha256 implies (`core.blobpaths`, a string operation), never from
the catalog's `blob_path`: an edited row cannot point a load at another file. It is held from before
it is read (`core.diskbudget.BlobHold`: a shared flock, its last use recorded), and the caller keeps
that hold as long as the engine lives, so no disk budget evicts a loaded engine.
"""

from __future__ import annotations

import contextlib  # imported by the interpreter's own start (site): free
import os

from enginecache.core.backends.loadtypes import ENGINE_HEADER_BYTES, LoadSpec
from enginecache.core.backends.registry import get_backend
from enginecache.core.blobpaths import blob_file
from enginecache.core.diskbudget import BlobHold, fetch_within_budget
from enginecache.core.lazyimport import import_backend
from enginecache.core.signing import check_statement, policy, row_expectations
from enginecache.core.targettext import split_targets
from enginecache.core.valuetype import Frozen, field
from enginecache.core.verdicts import Verdict
from enginecache.errors import (
    EngineRejectedError,
    IncompatibleEngineError,
    IntegrityCheckError,
    LoadFailedError,
    ProvenanceError,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    import logging
    from collections.abc import Callable, Mapping
    from pathlib import Path
    from typing import Any, TypedDict

    from enginecache.core.backends.base import Backend, EngineSession
    from enginecache.core.backends.loadtypes import PhaseTimer
    from enginecache.core.filelease import ReadLease
    from enginecache.core.verifiedread import MappedFile

    class _DigestArguments(TypedDict, total=False):
        sha256: str
        blake3_digest: str
        chunk_blake3: str | None


class EngineFacts(Frozen):
    """What loading an engine needs from its catalog row (and what a serving state file records).
    `home` is the store's, as a string; the blob's path follows from the digest (`blob_file`, and
    `blob` as a `Path`). A `core.valuetype` value (as the frozen dataclass it was; no `dataclasses`
    import on a cache hit, and no `pathlib` until `blob` is asked for)."""

    id: int
    backend: str
    backend_version: str
    precision: str
    targets: tuple[str, ...]
    home: str
    sha256: str | None
    blake3: str | None
    input_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    header_blake3: str | None = None
    chunk_blake3: str | None = None  # core.chunkdigests' encoding: a read checks each chunk as it lands
    # What its signed statement (core.signing) is checked against, and the statement itself
    cache_key: str | None = None
    onnx_digest: str | None = None  # the source model's digest the row records
    size_bytes: int | None = None
    signed_statement: str | None = None
    signature: str | None = None

    @classmethod
    def from_row(cls, home: str | os.PathLike[str], row: Mapping[str, Any]) -> EngineFacts:
        """From an engines row's columns (build_options already decoded from JSON)."""
        profiles = (row.get("build_options") or {}).get("profiles") or {}
        return cls(
            id=int(row["id"]),
            backend=str(row["backend"]),
            backend_version=str(row["backend_version"]),
            precision=str(row.get("precision") or ""),
            targets=split_targets(str(row.get("targets") or "")),
            home=os.fspath(home),
            sha256=row.get("sha256"),
            blake3=row.get("blake3"),
            input_shapes={name: tuple(p["opt"]) for name, p in profiles.items()},
            header_blake3=row.get("header_blake3"),
            chunk_blake3=row.get("chunk_blake3"),
            cache_key=row.get("cache_key"),
            onnx_digest=row.get("onnx_digest"),
            size_bytes=row.get("size_bytes"),
            signed_statement=row.get("signed_statement"),
            signature=row.get("signature"),
        )

    @property
    def blob_file(self) -> str:
        """The blob's path in the store, from its sha256 (IntegrityCheckError where none is recorded)."""
        return blob_file(self.home, self.sha256)

    @property
    def blob(self) -> Path:
        """`blob_file` as a `Path`."""
        from pathlib import Path

        return Path(self.blob_file)

    @property
    def verified_digest(self) -> dict[str, str]:
        """The digest a load checks: {"blake3": ...} where recorded, else {"sha256": ...}."""
        return {"blake3": self.blake3} if self.blake3 else {"sha256": self.sha256 or ""}

    @property
    def check_arguments(self) -> _DigestArguments:
        """`core.hashing`'s keyword arguments for the digest a load checks (BLAKE3 where recorded,
        with its chunk digests; an engine with no digest at all fails the sha256 check, as a changed
        one)."""
        if self.blake3:
            return {"blake3_digest": self.blake3, "chunk_blake3": self.chunk_blake3}
        return {"sha256": self.sha256 or ""}

    def signed_row(self) -> dict[str, Any]:
        """What its signed statement must say of it (`core.signing.row_expectations`)."""
        return row_expectations(
            {
                "sha256": self.sha256,
                "blake3": self.blake3,
                "header_blake3": self.header_blake3,
                "chunk_blake3": self.chunk_blake3,
                "size_bytes": self.size_bytes,
                "cache_key": self.cache_key,
                "onnx_digest": self.onnx_digest,
                "backend": self.backend,
                "backend_version": self.backend_version,
                "precision": self.precision,
                "targets": self.targets,
            }
        )

    def load_spec(self) -> LoadSpec:
        return LoadSpec(
            input_shapes=dict(self.input_shapes),
            label=f"engine {self.id}",
            backend_version=self.backend_version,
            targets=self.targets,
        )


def load_error_note(message: str) -> str:
    """What an engine's `error` says once a runtime refused it on this host (its status stays:
    another host may load it)."""
    import socket  # the rare path pays for its imports
    from datetime import UTC, datetime

    when = datetime.now(UTC).isoformat(timespec="seconds")
    return f"{socket.gethostname()} could not load it ({when}): {message}"


def _corrupt(facts: EngineFacts, err: BaseException, on_corrupt: Callable[[str], None]) -> EngineRejectedError:
    on_corrupt(str(err))
    return EngineRejectedError(
        f"engine {facts.id} is CORRUPT and was refused (now marked CORRUPT): {err}",
        engine_id=facts.id,
        verdict=Verdict.CORRUPT.outcome,
    )


def check_provenance(
    facts: EngineFacts,
    timer: PhaseTimer,
    *,
    request: Mapping[str, Any] | None = None,
    on_tampered: Callable[[str], None] | None = None,
) -> None:
    """Where this process trusts signing keys (`core.signing.policy`), the engine's signed statement
    checked against its row and `request` (dotted paths into the statement -> what the caller asked
    for; phase `provenance`). A row that no longer says what was signed calls `on_tampered` and raises
    EngineRejectedError TAMPERED; a statement signed for another request is TAMPERED without the
    call; an unsigned engine, or one signed by a key not trusted here, is UNTRUSTED. Without trusted
    keys nothing is checked."""
    with timer.phase("provenance"):
        checks = policy()
        if checks is None:
            return
        try:
            check_statement(
                facts.signed_statement,
                facts.signature,
                row=facts.signed_row(),
                request=request or {},
                checks=checks,
                label=f"engine {facts.id}",
            )
        except ProvenanceError as err:
            if err.row_changed and on_tampered is not None:
                on_tampered(str(err))
            raise EngineRejectedError(str(err), engine_id=facts.id, verdict=err.verdict) from err


def _fetch(facts: EngineFacts, on_corrupt: Callable[[str], None]) -> None:
    """A remote store configured and the blob not here yet: fetched and verified, within the store
    cache's budget where one is set (core.diskbudget; StoreError: the remote is unavailable, or the
    blob is larger than the budget); the remote's copy missing or not the blob is CORRUPT, as a
    missing one."""
    try:
        fetch_within_budget(facts.home, facts.sha256, chunk_blake3=facts.chunk_blake3)
    except IntegrityCheckError as err:
        raise _corrupt(facts, err, on_corrupt) from err


def read_blob(facts: EngineFacts, timer: PhaseTimer, on_corrupt: Callable[[str], None]) -> bytes:
    """The engine's blob (fetched first where a remote store has it and this host does not),
    verified in the pass that reads it (phase `read_verify`). A mismatch or a missing blob calls
    `on_corrupt` and raises EngineRejectedError (verdict CORRUPT)."""
    _fetch(facts, on_corrupt)
    return _read_whole(facts, timer, on_corrupt)


def _read_whole(facts: EngineFacts, timer: PhaseTimer, on_corrupt: Callable[[str], None]) -> bytes:
    """`read_blob` of a blob that is here."""
    from enginecache.core.verifiedread import read_verified

    try:
        with timer.phase("read_verify"):
            return read_verified(facts.blob_file, as_bytes=True, **facts.check_arguments)
    except (IntegrityCheckError, OSError) as err:
        raise _corrupt(facts, err, on_corrupt) from err


def _read_header(facts: EngineFacts, timer: PhaseTimer, on_corrupt: Callable[[str], None]) -> bytes:
    """The first ENGINE_HEADER_BYTES of a blob that is here, verified against `header_blake3` (phase
    `read_header`). A mismatch, a short file or a missing blob calls `on_corrupt` and raises
    EngineRejectedError (verdict CORRUPT)."""
    from enginecache.core.hashing import head_digest

    try:
        with timer.phase("read_header"):
            fd = os.open(facts.blob_file, os.O_RDONLY)
            try:
                header = os.pread(fd, ENGINE_HEADER_BYTES, 0)
            finally:
                os.close(fd)
            found = head_digest(header)
            if found != facts.header_blake3:
                raise IntegrityCheckError(
                    f"the first {len(header)} bytes of {facts.blob_file} hash to {found}, "
                    f"the catalog records {facts.header_blake3}"
                )
    except (IntegrityCheckError, OSError) as err:
        raise _corrupt(facts, err, on_corrupt) from err
    return header


def load_engine(
    facts: EngineFacts,
    timer: PhaseTimer,
    *,
    on_corrupt: Callable[[str], None],
    hold: BlobHold | None = None,
    request: Mapping[str, Any] | None = None,
    on_tampered: Callable[[str], None] | None = None,
    runtime_cache: str | None = None,
) -> EngineSession:
    """The runtime's import (phase `import_runtime`: a missing library fails before anything is read);
    the signed statement checked against the row and `request` where trusted keys are configured
    (`check_provenance`: nothing is read before it passed); where the catalog records the header's
    digest, the backend's header check on the verified header (a refusal reads nothing more); the
    verified read of the whole blob; then the backend's load of the verified bytes (its header check
    first).

    From before the blob is read it is held (`core.diskbudget.BlobHold`: no disk budget's eviction
    removes it, and its last use is recorded): `hold`, where given, is left holding it for the caller
    to close with the session (also where the blob is not there: then it holds nothing); without
    it, the hold ends on return. A load that raises holds nothing. `runtime_cache`: a TensorRT-RTX
    runtime-cache file already chosen and checked (`service.serving.runtimecache`), handed to the
    backend's load (`LoadSpec.runtime_cache`).

    Raises EngineRejectedError: TAMPERED or UNTRUSTED (`check_provenance`), CORRUPT (bytes do not
    match, or the blob is gone; `on_corrupt` ran), INCOMPATIBLE (the backend's validity test) or ERROR
    (the runtime could not load it).
    """
    backend = get_backend(facts.backend)
    with timer.phase("import_runtime"):
        import_backend(backend.module, backend.declaration.install_hint)
    check_provenance(facts, timer, request=request, on_tampered=on_tampered)
    spec = facts.load_spec()
    if runtime_cache is not None:
        spec = spec.replace(runtime_cache=runtime_cache)
    _fetch(facts, on_corrupt)
    held = BlobHold() if hold is None else hold
    if not held.take(facts.blob_file):  # evicted by another process since the fetch: fetched once more
        _fetch(facts, on_corrupt)
        held.take(facts.blob_file)
    try:
        return _load_here(backend, facts, spec, timer, on_corrupt)
    except BaseException:
        held.close()
        raise
    finally:
        if hold is None:
            held.close()


def _load_here(
    backend: Backend, facts: EngineFacts, spec: LoadSpec, timer: PhaseTimer, on_corrupt: Callable[[str], None]
) -> EngineSession:
    """`load_engine` once the blob is here (and held)."""
    if facts.header_blake3:
        header = _read_header(facts, timer, on_corrupt)
        try:
            backend.check_header(header, spec, timer)
        except LoadFailedError as err:
            raise _refused(facts, err) from err
    session = _load_in_place(backend, facts, spec, timer, on_corrupt)
    if session is not None:
        return session
    buffer = _read_whole(facts, timer, on_corrupt)
    try:
        return backend.load(buffer, spec, timer)
    except LoadFailedError as err:  # IncompatibleEngineError included
        raise _refused(facts, err) from err


def _load_in_place(
    backend: Backend, facts: EngineFacts, spec: LoadSpec, timer: PhaseTimer, on_corrupt: Callable[[str], None]
) -> EngineSession | None:
    """The runtime reads the store file's own bytes, with no copy of ours, under a read lease
    (`core.filelease`) taken before they are hashed (phase `read_verify`) and checked once the runtime
    is done with them, so what it read is what was hashed: a runtime that reads files itself
    (`Backend.reads_files`: ONNX Runtime) opens the leased file after it was hashed where it lies; any
    other (TensorRT) deserializes from the leased file mapped read-only, hashed from that mapping on
    every core and unmapped before the lease goes (`core.verifiedread.map_file`). None where no lease
    can be had here, where the file cannot be mapped here, or where someone opened the file for
    writing meanwhile: the caller then reads a verified copy, which decides whether a byte changed. A
    mismatch under an intact lease calls `on_corrupt` and raises EngineRejectedError (CORRUPT); a
    refusal raises it as `load_engine` does (ERROR also where the runtime kept a view of the mapping)."""
    from enginecache.core.filelease import take_read_lease

    try:
        lease = take_read_lease(facts.blob_file)
    except OSError as err:  # missing or unreadable: what the copy's read would have met
        raise _corrupt(facts, err, on_corrupt) from err
    if lease is None:
        return None
    with lease:
        mapping: MappedFile | None = None
        if not backend.reads_files:
            from enginecache.core.verifiedread import map_file

            try:
                mapping = map_file(lease, name=facts.blob_file)
            except OSError as err:  # this host's limit (ENOMEM, a filesystem without mmap), not the file's fault
                _log().warning("%s cannot be mapped here (%s): reading a verified copy instead", facts.blob_file, err)
                return None
        session: EngineSession | None = None
        try:
            with mapping if mapping is not None else contextlib.nullcontext():  # unmapped before the lease goes
                session = _load_leased(backend, facts, spec, timer, on_corrupt, lease, mapping)
        except EngineRejectedError:  # the verdict on the load itself
            raise
        except LoadFailedError as err:  # else only the unmapping raises it: the runtime kept a view
            if session is not None:
                session.close()
            raise _refused(facts, err) from err
        return session


def _load_leased(
    backend: Backend,
    facts: EngineFacts,
    spec: LoadSpec,
    timer: PhaseTimer,
    on_corrupt: Callable[[str], None],
    lease: ReadLease,
    mapping: MappedFile | None,
) -> EngineSession | None:
    """`_load_in_place` once the lease is held: the blob hashed where it lies (`mapping` None: the
    runtime then opens `lease.path`) or from `mapping` (the runtime then gets its view), the runtime's
    load, and the lease's check (a broken one: the session closed, None)."""
    try:
        with timer.phase("read_verify"):
            if mapping is None:
                from enginecache.core.hashing import verify_file

                verify_file(lease.path, name=facts.blob_file, **facts.check_arguments)
            else:
                mapping.verify(**facts.check_arguments)
    except IntegrityCheckError as err:
        if not lease.intact():
            return None  # it was being written: the copy's read tells a changed file from a torn one
        raise _corrupt(facts, err, on_corrupt) from err
    except OSError as err:
        raise _corrupt(facts, err, on_corrupt) from err
    try:
        session = (
            backend.load_file(lease.path, spec, timer) if mapping is None else backend.load(mapping.view, spec, timer)
        )
    except LoadFailedError as err:
        if not lease.intact():
            return None
        raise _refused(facts, err) from err
    if lease.intact():
        return session
    session.close()
    _log().warning("%s was opened for writing while it loaded: reading a verified copy instead", facts.blob_file)
    return None


def _log() -> logging.Logger:
    import logging  # the rare paths pay for it

    return logging.getLogger(__name__)


def _refused(facts: EngineFacts, err: LoadFailedError) -> EngineRejectedError:
    """The verdict on a runtime's refusal: INCOMPATIBLE (its validity test) or ERROR (it could not load)."""
    if isinstance(err, IncompatibleEngineError):
        return EngineRejectedError(
            str(err), engine_id=facts.id, verdict=Verdict.INCOMPATIBLE.outcome, details=err.details
        )
    return EngineRejectedError(str(err), engine_id=facts.id, verdict=Verdict.ERROR.outcome)
