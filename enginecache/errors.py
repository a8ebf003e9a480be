"""Every error enginecache raises, in one tree (the way httpx keeps its exceptions).

Callers catch a *kind* (the second level); the leaves say exactly what went wrong. The CLI maps the
kind to its exit code (`exit_code` on each class): 1 failed or corrupt, 2 bad input (nothing was
stored), 3 the catalog or the store is unavailable (try again later).

    EngineCacheError                         exit 1
    ├── BadInputError                        exit 2: the request itself is unusable; nothing was stored
    │   ├── InvalidModelError                not a usable ONNX model (missing, empty, truncated, not ONNX)
    │   │   ├── ExternalDataError            an unsafe or missing external data reference
    │   │   └── UploadError                  an uploaded file or archive refused by the dashboard
    │   ├── ProfileError                     an optimization profile that does not fit the model's inputs
    │   ├── TargetError                      an unknown backend or build target
    │   ├── PrecisionError                   an unknown precision, or a conversion that failed
    │   │   └── CalibrationError             calibration data that does not fit the model's inputs
    │   ├── BuildOptionError                 a build option outside what the backend takes
    │   ├── TestInputError                   test-load inputs or options that do not fit the engine
    │   ├── ExportError                      an export that cannot be written as asked
    │   ├── AmbiguousError                   a name that matches more than one row
    │   ├── ModelNameError                   a model name outside the pattern, or taken by other bytes
    │   │   └── ModelNameTakenError          ... taken by other bytes (register them as its new version)
    │   ├── BackupRefusedError               backup or restore refused: the destination, home or catalog is not empty
    │   ├── ImportRefusedError               `engine import` refused: not an engine, or its header contradicts it
    │   ├── SigningKeyError                  a signing or trusted key that cannot be used (not Ed25519, readable by all)
    │   └── ServeError                       `serve` cannot start as asked (port taken, bad address)
    ├── NotFoundError                        exit 2: no row with that id, name or digest
    ├── AccessDeniedError                    exit 2 ("forbidden"): the user's role does not allow it
    ├── IntegrityCheckError                  bytes that do not match their recorded digest (CORRUPT)
    │   └── ProvenanceError                  an engine no trusted signature vouches for (TAMPERED or UNTRUSTED)
    ├── BuildFailedError                     the backend ran and failed; carries its own words
    ├── LoadFailedError                      an engine could not be loaded (deserialize, context, I/O)
    │   ├── IncompatibleEngineError          the backend's own validity check refuses it on this host
    │   └── EngineRejectedError              load_or_build refused the cached engine (CORRUPT, INCOMPATIBLE, ERROR)
    ├── BackendUnavailableError              the backend library is not installed on this host
    ├── InferenceError                       inference failed (bad feeds, or the backend refused them)
    ├── CudaError                            a CUDA driver or runtime call failed
    ├── MissError                            load_or_build found no engine (nearest engine and differing fields)
    │   ├── EngineQueuedError                ... and queued a build for it (job id)
    │   └── NoEngineFitsError                `pull`: no engine of the model fits this host (each one's reason)
    ├── StaleLeaseError                      a job holder's write after its lease was taken over
    ├── JobWaitError                         a wait for a job ended first: it ran out, or nothing can run the job
    ├── BackupToolError                      pg_dump or pg_restore is missing, too old for the server, or failed
    └── UnavailableError                     exit 3: the catalog or the store cannot be reached or written
        ├── CatalogUnavailableError          the database is down, unreachable or refuses the connection
        └── StoreError                       the artifact store could not write or read (disk full, I/O)

No class here shadows a library's name (SQLAlchemy's IntegrityError, pydantic's ValidationError).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNAVAILABLE = 3


class EngineCacheError(Exception):
    """Root of every error enginecache raises."""

    exit_code = EXIT_FAILED
    kind = "failed"


# -- bad input (exit 2) ---------------------------------------------------------------------


class BadInputError(EngineCacheError):
    """The request itself is unusable; the message names the problem and nothing was stored."""

    exit_code = EXIT_BAD_INPUT
    kind = "bad_input"


class InvalidModelError(BadInputError):
    """The file is not a usable ONNX model (missing, empty, truncated, not ONNX)."""


class ExternalDataError(InvalidModelError):
    """An external data reference is unsafe (absolute, `..`, symlink, escapes) or missing."""


class UploadError(InvalidModelError):
    """An uploaded file or archive the dashboard refuses (type, size, unsafe member)."""


class ProfileError(BadInputError):
    """An optimization profile does not match the model's inputs."""


class TargetError(BadInputError):
    """An unknown backend, or an unknown or unsupported build target."""


class PrecisionError(BadInputError):
    """An unknown precision, or a precision conversion that failed."""


class CalibrationError(PrecisionError):
    """Calibration data that does not match the model's inputs."""


class BuildOptionError(BadInputError):
    """A build option (optimization level, workspace, ...) outside what the backend takes."""


class TestInputError(BadInputError):
    """Test-load inputs or options (inputs file, batch, iterations, tolerances) that do not fit."""

    __test__ = False  # not a pytest class


class ExportError(BadInputError):
    """An export that cannot be written as asked (unknown format, no engines to export)."""


class AmbiguousError(BadInputError):
    """A name matches more than one row."""


class ModelNameError(BadInputError):
    """A user-chosen name is unusable: outside the documented pattern, or taken by other bytes."""

    kind = "bad_name"


class ModelNameTakenError(ModelNameError):
    """A source model's name is held by other bytes, and the registration did not ask for a new version
    of it; `name` is the name (a front end offers "register as its new version" for it)."""

    def __init__(self, message: str, *, name: str) -> None:
        super().__init__(message)
        self.name = name


class ServeError(BadInputError):
    """`enginecache serve` cannot start as asked (port in use, bad address)."""


class BackupRefusedError(BadInputError):
    """`backup` or `restore` refused before writing anything: the destination is not empty, the home
    or the target catalog already holds something, or the source is not a backup this version reads."""


class ImportRefusedError(BadInputError):
    """An engine file `engine import` refuses before storing anything: not an engine of the declared
    backend, or its own header contradicting the declaration (the message names both values)."""

    kind = "import_refused"


class SigningKeyError(BadInputError):
    """A signing key or trusted key (`core.signing`) that cannot be used: missing, unreadable, not an
    Ed25519 key in PEM, or a private key that others may read; the message names the file."""

    kind = "signing_key"


# -- not found (exit 2) ---------------------------------------------------------------------


class NotFoundError(EngineCacheError):
    """No row matches the given id, name or digest."""

    exit_code = EXIT_BAD_INPUT
    kind = "not_found"


# -- access denied (exit 2) ------------------------------------------------------------------


class AccessDeniedError(EngineCacheError):
    """The acting user's role (or their lack of one) does not allow what they asked; the message
    names the user, their role and the role it needs. Nothing was changed."""

    exit_code = EXIT_BAD_INPUT
    kind = "forbidden"


# -- failed or refused (exit 1) ---------------------------------------------------------------


class IntegrityCheckError(EngineCacheError):
    """A blob's bytes do not match its recorded digest (the engine or model is CORRUPT)."""

    kind = "integrity"


class ProvenanceError(IntegrityCheckError):
    """An engine's signed statement (`core.signing`) does not vouch for it: `verdict` TAMPERED (a
    signature that does not verify, or a statement that does not match the row or the request) or
    UNTRUSTED (unsigned, or signed by a key not trusted here). `row_changed`: the row itself
    contradicts its statement (the engine is marked TAMPERED), not only the request."""

    kind = "provenance"

    def __init__(self, message: str, *, verdict: str, row_changed: bool = False) -> None:
        super().__init__(message)
        self.verdict = verdict
        self.row_changed = row_changed


class BuildFailedError(EngineCacheError):
    """A build ran and failed; the message carries the backend's own words. `engine_id` names the
    FAILED engine record where one was written."""

    kind = "build_failed"

    def __init__(self, message: str, engine_id: int | None = None) -> None:
        super().__init__(message)
        self.engine_id = engine_id


class LoadFailedError(EngineCacheError):
    """An engine could not be loaded (deserialize, context, allocation); carries the backend's words."""

    kind = "load_failed"


class IncompatibleEngineError(LoadFailedError):
    """The backend's own validity check refuses the engine on this host (its diagnostic in `details`)."""

    kind = "incompatible"

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details: dict[str, Any] = dict(details or {})


class EngineRejectedError(LoadFailedError):
    """load_or_build refused the cached engine: CORRUPT (digest mismatch, now marked), INCOMPATIBLE
    (the backend's validity check) or ERROR (the runtime could not load it)."""

    kind = "rejected"

    def __init__(self, message: str, *, engine_id: int, verdict: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.engine_id = engine_id
        self.verdict = verdict
        self.details = dict(details or {})


class BackendUnavailableError(EngineCacheError):
    """A backend library (TensorRT, TensorRT-RTX, ONNX Runtime) is not importable here."""

    kind = "backend_unavailable"


class InferenceError(EngineCacheError):
    """Inference failed (bad feeds, or the backend refused them)."""

    kind = "inference_failed"


class CudaError(EngineCacheError):
    """A CUDA driver or runtime call failed (the call and CUDA's own error name in the message)."""

    kind = "cuda"


class MissError(EngineCacheError):
    """No engine for this model, spec and host; says what is nearest and which fields differ."""

    kind = "miss"

    def __init__(
        self,
        message: str,
        *,
        nearest: dict[str, Any] | None = None,
        diffs: Sequence[Any] | None = None,
        job_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.nearest = nearest
        self.diffs = list(diffs or [])
        self.job_id = job_id


class EngineQueuedError(MissError):
    """A miss with on_miss="queue": a build job was queued (or joined); `job_id` names it."""

    kind = "queued"


class NoEngineFitsError(MissError):
    """`pull` found no engine of the model that this host can load; the message gives each engine's reason."""

    kind = "no_engine_fits"


class StaleLeaseError(EngineCacheError):
    """A write by a job holder whose lease token is no longer the job's (expired, taken over)."""

    kind = "stale_lease"


class JobWaitError(EngineCacheError):
    """A wait for a job ended before the job did: the wait ran out (`timed_out`, after `seconds`),
    or no live worker and not this host can run the job, so it never would. `waited_for` says what
    the job was waiting for (a worker with ..., a running attempt on worker ...)."""

    kind = "wait"

    def __init__(self, message: str, *, job_id: int, waited_for: str, seconds: float | None = None) -> None:
        super().__init__(message)
        self.job_id = job_id
        self.waited_for = waited_for
        self.seconds = seconds

    @property
    def timed_out(self) -> bool:
        return self.seconds is not None


class BackupToolError(EngineCacheError):
    """A PostgreSQL client program a backup or restore runs (pg_dump, pg_restore) is missing, older
    than it must be, or failed; the message carries its own words."""

    kind = "backup_tool"


# -- unavailable (exit 3) -------------------------------------------------------------------


class UnavailableError(EngineCacheError):
    """The catalog or the store cannot be reached or written; nothing about the request is wrong."""

    exit_code = EXIT_UNAVAILABLE
    kind = "unavailable"


class CatalogUnavailableError(UnavailableError):
    """The catalog database is down, unreachable, or refuses the connection."""


class StoreError(UnavailableError):
    """The artifact store could not write or read a blob (disk full, I/O error, permissions)."""


def exit_code_for(error: BaseException) -> int:
    """The CLI exit code of an error: its kind's code, 1 for anything outside the tree."""
    return error.exit_code if isinstance(error, EngineCacheError) else EXIT_FAILED
