"""Signed engine provenance: the statement a build pool signs for an engine, the keys, and the check
of a stored statement against its engine row, its bytes' digests and the request.

The statement (`engine_statement`) binds an engine's bytes (sha256, BLAKE3, header and chunk
digests, size) to its cache key and every ingredient of it, the source model (digest and name), the
backend and its exact version, the precision and targets, and who built, imported or signed it. It
is kept as the canonical JSON text that was signed (`statement_text`: sorted keys, no whitespace,
ASCII), beside an Ed25519 signature written `ed25519:<key id>:<base64>`; a key's id is the first 16
hex digits of the BLAKE3 of its 32 raw bytes (`key_id`).

Keys come from the environment (docs/security.md, "Signed engines"):

- `ENGINECACHE_SIGNING_KEY`: the private key a build pool (its workers, and an admin's
  `verify --sign`) signs with: a PEM PKCS#8 Ed25519 key, unencrypted, that only its owner may read.
- `ENGINECACHE_TRUSTED_KEYS`: the public keys this process accepts, as files (PEM `PUBLIC KEY`
  blocks, several per file allowed) or folders of `*.pub` / `*.pem` files, separated by `os.pathsep`.
  Set, every load, `pull`, `verify` and `check` refuses an engine that no trusted key vouches for
  (`check_statement`); unset, nothing is checked and signatures are only reported.
- `ENGINECACHE_SIGNATURE_RECEIPTS`: where this user keeps the receipts of signatures it verified
  (default `$XDG_CACHE_HOME/enginecache/verified-<uid>/`; `off`: none kept).

What `check_statement` decides, in this order: no statement or signature is UNTRUSTED (the remedy:
an admin's `enginecache verify --sign`); a signature that is not `ed25519:<id>:<base64>` is TAMPERED;
a key not trusted here is UNTRUSTED; a signature that does not verify is TAMPERED; a statement that
disagrees with its row (`row_expectations`) is TAMPERED with `row_changed` (the caller marks the
engine TAMPERED); one that disagrees with the request (the model digest, backend, version, precision,
cache key or ingredients the caller asked for) is TAMPERED without it. The bytes are bound through
the row: every load, `verify` and `check` hashes the blob against the row's digests, and the row's
digests must be the statement's.

The cache hit's cost: importing `cryptography` costs about 8-12 ms in a new process, more than
the hit path's margin. So the Ed25519 check runs once per (public key, statement, signature) and
user: a verified signature leaves an empty file named by the BLAKE3 of the three in the receipts
folder, which must be owned by this user and writable by no one else (a folder that is not is not
used). A later check finds the receipt with one `stat` and imports nothing; an attacker who can
write the catalog cannot write that folder, and a statement or signature changed by one byte names
another receipt. Which keys are trusted is read again at every check, so a key taken out of
`ENGINECACHE_TRUSTED_KEYS` stops vouching at once, receipts or not.

This module imports only the stdlib and `blake3` (a cache hit has both); `cryptography` is imported
by the functions that sign, generate keys or verify a signature with no receipt.
"""

from __future__ import annotations

import binascii
import json
import os

import blake3

from enginecache.core.targettext import split_targets
from enginecache.errors import ProvenanceError, SigningKeyError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Any

SIGNING_KEY_ENV = "ENGINECACHE_SIGNING_KEY"
TRUSTED_KEYS_ENV = "ENGINECACHE_TRUSTED_KEYS"
RECEIPTS_ENV = "ENGINECACHE_SIGNATURE_RECEIPTS"
ALGORITHM = "ed25519"
STATEMENT_FORMAT = "enginecache-statement-v1"
TAMPERED, UNTRUSTED = "TAMPERED", "UNTRUSTED"  # `core.verdicts.Verdict`'s outcomes
SIGN_REMEDY = "an admin signs engines from before signing with `enginecache verify --sign`"
PUBLIC_KEY_SUFFIXES = (".pub", ".pem")  # the files a trusted-keys folder contributes
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")  # DER SubjectPublicKeyInfo of Ed25519, less the key
_RECEIPT_DOMAIN = b"enginecache-signature-receipt-v1\0"
_STAT_DOMAIN = b"enginecache-stat-receipt-v1\0"
_OFF = ("off", "0", "none", "no", "false")


def key_id(public: bytes) -> str:
    """A public key's id: the first 16 hex digits of the BLAKE3 of its 32 raw bytes."""
    return blake3.blake3(public).hexdigest()[:16]


def statement_text(statement: Mapping[str, Any]) -> str:
    """The canonical JSON text a statement is signed and stored as."""
    return json.dumps(statement, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def engine_statement(
    *,
    sha256: str,
    blake3_digest: str | None,
    header_blake3: str | None,
    chunk_blake3: str | None,
    size_bytes: int,
    cache_key: str,
    ingredients: Mapping[str, Any],
    model_digest: str,
    model_name: str,
    backend: str,
    backend_version: str,
    precision: str,
    targets: Sequence[str] | str,
    origin: Mapping[str, Any],
    key: str,
    signed_at: str,
) -> dict[str, Any]:
    """The statement a key signs for an engine (module docstring); `origin` says who built, imported
    or signed it (`kind`, `by`, ...), `key` is the signing key's id, `signed_at` an ISO time."""
    return {
        "format": STATEMENT_FORMAT,
        "engine": {
            "sha256": sha256,
            "blake3": blake3_digest or None,
            "header_blake3": header_blake3 or None,
            "chunk_blake3": chunk_blake3 or None,
            "size_bytes": int(size_bytes),
        },
        "cache_key": cache_key,
        "ingredients": dict(ingredients),
        "model": {"digest": model_digest, "name": model_name},
        "backend": backend,
        "backend_version": backend_version,
        "precision": precision,
        "targets": _targets(targets),
        "origin": dict(origin),
        "key_id": key,
        "signed_at": signed_at,
    }


def _targets(targets: Sequence[str] | str | None) -> list[str]:
    return list(split_targets(targets) if isinstance(targets, str) or targets is None else targets)


def row_expectations(row: Mapping[str, Any]) -> dict[str, Any]:
    """What a statement must say of the engine row it is stored with (dotted paths into the
    statement -> the row's value): its digests and size, cache key, source model digest
    (`onnx_digest`), backend, version, precision and targets (the catalog's text or a sequence)."""
    return {
        "engine.sha256": row.get("sha256"),
        "engine.blake3": row.get("blake3"),
        "engine.header_blake3": row.get("header_blake3"),
        "engine.chunk_blake3": row.get("chunk_blake3"),
        "engine.size_bytes": row.get("size_bytes"),
        "cache_key": row.get("cache_key"),
        "model.digest": row.get("onnx_digest"),
        "backend": row.get("backend"),
        "backend_version": row.get("backend_version"),
        "precision": row.get("precision"),
        "targets": _targets(row.get("targets")),
    }


_MISSING = object()


def _at(statement: Mapping[str, Any], path: str) -> Any:
    value: Any = statement
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _canonical(value: Any) -> str:
    """A value as compared: "" and None alike, a tuple as a list, mappings by sorted keys."""
    if value is None or value == "":
        return "null"
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _shown(value: Any) -> str:
    text = "(absent)" if value is _MISSING else _canonical(value)
    return text if len(text) <= 80 else text[:77] + "..."


def mismatches(statement: Mapping[str, Any], expected: Mapping[str, Any], *, what: str) -> list[str]:
    """Each dotted path whose value in `statement` differs from `expected`'s, said as
    'PATH: signed X, WHAT Y' ("" and None count as the same)."""
    found = []
    for path, wanted in expected.items():
        signed = _at(statement, path)
        if signed is _MISSING or _canonical(signed) != _canonical(wanted):
            found.append(f"{path}: signed {_shown(signed)}, {what} {_shown(wanted)}")
    return found


# -- keys -----------------------------------------------------------------------------------------


def _read_bytes(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as stream:
            return stream.read(1 << 20)
    except OSError as err:
        raise SigningKeyError(f"{what} {path} cannot be read: {err.strerror or err}") from err


def _pem_blocks(data: bytes, label: str, path: str) -> list[bytes]:
    """The DER of each `-----BEGIN <label>-----` block in `data` (SigningKeyError for a broken one)."""
    begin, end = f"-----BEGIN {label}-----".encode(), f"-----END {label}-----".encode()
    blocks, rest = [], data
    while begin in rest:
        start = rest.index(begin) + len(begin)
        stop = rest.find(end, start)
        if stop < 0:
            raise SigningKeyError(f"{path}: a PEM {label} block without its END line")
        try:
            blocks.append(binascii.a2b_base64(rest[start:stop].replace(b"\r", b"").replace(b"\n", b"")))
        except binascii.Error as err:
            raise SigningKeyError(f"{path}: a PEM {label} block that is not base64: {err}") from err
        rest = rest[stop + len(end) :]
    return blocks


def public_keys_in(path: str) -> list[bytes]:
    """The raw 32-byte Ed25519 public keys of a PEM file (SigningKeyError where it holds none, or a
    key of another kind)."""
    blocks = _pem_blocks(_read_bytes(path, "trusted key file"), "PUBLIC KEY", path)
    if not blocks:
        raise SigningKeyError(
            f"{path}: no PEM PUBLIC KEY block (an Ed25519 public key, as `enginecache keys generate` writes)"
        )
    keys = []
    for der in blocks:
        if len(der) != len(_SPKI_PREFIX) + 32 or not der.startswith(_SPKI_PREFIX):
            raise SigningKeyError(f"{path}: a public key that is not Ed25519")
        keys.append(der[len(_SPKI_PREFIX) :])
    return keys


def public_key_pem(public: bytes) -> str:
    """An Ed25519 public key as a PEM `PUBLIC KEY` block (what `public_keys_in` reads)."""
    body = binascii.b2a_base64(_SPKI_PREFIX + public, newline=False).decode()
    return f"-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n"


class TrustedKeys:
    """The public keys this process accepts, by key id (`sources`: the file each came from)."""

    __slots__ = ("keys", "sources")

    def __init__(self, keys: Mapping[str, bytes], sources: Mapping[str, str]) -> None:
        self.keys = dict(keys)
        self.sources = dict(sources)

    def get(self, key: str) -> bytes | None:
        return self.keys.get(key)

    def describe(self) -> str:
        return ", ".join(sorted(self.keys)) or "none"


def _key_files(entry: str) -> list[str]:
    if os.path.isdir(entry):
        with os.scandir(entry) as listing:
            return sorted(e.path for e in listing if e.name.endswith(PUBLIC_KEY_SUFFIXES) and e.is_file())
    return [entry]


def trusted_keys(env: Mapping[str, str] | None = None) -> TrustedKeys | None:
    """The keys `ENGINECACHE_TRUSTED_KEYS` names; None where it is unset or empty (nothing is
    checked). SigningKeyError where a named file or folder is missing, unreadable, holds a key that
    is not Ed25519, or where the setting names no key at all."""
    value = (os.environ if env is None else env).get(TRUSTED_KEYS_ENV, "").strip()
    if not value:
        return None
    keys: dict[str, bytes] = {}
    sources: dict[str, str] = {}
    for entry in (part.strip() for part in value.split(os.pathsep)):
        if not entry:
            continue
        if not os.path.exists(entry):
            raise SigningKeyError(f"{TRUSTED_KEYS_ENV} names {entry}, which does not exist")
        for path in _key_files(entry):
            for public in public_keys_in(path):
                keys[key_id(public)] = public
                sources[key_id(public)] = path
    if not keys:
        raise SigningKeyError(f"{TRUSTED_KEYS_ENV}={value} names no public key (*.pub or *.pem files)")
    return TrustedKeys(keys, sources)


class SigningKey:
    """A build pool's private key (`load_signing_key`): its public half, its id, and `sign`."""

    __slots__ = ("_private", "key_id", "path", "public")

    def __init__(self, private: Any, path: str) -> None:
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

        self._private = private
        self.path = path
        self.public: bytes = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.key_id = key_id(self.public)

    def sign(self, text: str) -> str:
        """The signature of `text` (UTF-8), written `ed25519:<key id>:<base64>`."""
        signature = self._private.sign(text.encode())
        return f"{ALGORITHM}:{self.key_id}:{binascii.b2a_base64(signature, newline=False).decode()}"


def load_signing_key(path: str | os.PathLike[str]) -> SigningKey:
    """The Ed25519 private key in the PEM file at `path`. SigningKeyError where it is missing,
    unreadable, readable or writable by group or others (`chmod 600` it), encrypted, or not Ed25519."""
    name = os.fspath(path)
    try:
        mode = os.stat(name).st_mode
    except OSError as err:
        raise SigningKeyError(f"signing key {name} cannot be read: {err.strerror or err}") from err
    if mode & 0o077:
        raise SigningKeyError(f"signing key {name} may be read by others (mode {mode & 0o777:o}): chmod 600 {name}")
    data = _read_bytes(name, "signing key")
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        private = load_pem_private_key(data, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise SigningKeyError(f"signing key {name} is not an unencrypted PEM private key: {err}") from err
    if not isinstance(private, Ed25519PrivateKey):
        raise SigningKeyError(f"signing key {name} is not an Ed25519 key")
    return SigningKey(private, name)


def signing_key(env: Mapping[str, str] | None = None) -> SigningKey | None:
    """The key `ENGINECACHE_SIGNING_KEY` names (`load_signing_key`), None where it is unset."""
    value = (os.environ if env is None else env).get(SIGNING_KEY_ENV, "").strip()
    return load_signing_key(value) if value else None


def generate_key(folder: str | os.PathLike[str], name: str) -> tuple[str, str, str]:
    """A new Ed25519 key pair written as `folder/NAME.key` (PEM PKCS#8, mode 600) and
    `folder/NAME.pub` (PEM): (private path, public path, key id). Neither file may exist already
    (SigningKeyError: nothing is overwritten, and a half-written pair is removed)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

    if not name or os.sep in name or name.startswith("."):
        raise SigningKeyError(f"{name!r} is not a key name: letters, digits, '-', '_' (it names NAME.key and NAME.pub)")
    base = os.fspath(folder)
    os.makedirs(base, mode=0o700, exist_ok=True)
    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    written: list[str] = []
    try:
        for path, data, mode in (
            (os.path.join(base, f"{name}.key"), pem, 0o600),
            (os.path.join(base, f"{name}.pub"), public_key_pem(public).encode(), 0o644),
        ):
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            except FileExistsError:
                raise SigningKeyError(f"{path} exists already: nothing was written (choose another name)") from None
            written.append(path)
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
                stream.flush()
                os.fsync(stream.fileno())
    except BaseException:
        for path in written:
            os.unlink(path)
        raise
    return written[0], written[1], key_id(public)


# -- signatures and their receipts ----------------------------------------------------------------


def parse_signature(text: str) -> tuple[str, bytes]:
    """(key id, signature bytes) of `ed25519:<key id>:<base64>`; ValueError for anything else."""
    algorithm, _, rest = text.partition(":")
    key, _, encoded = rest.partition(":")
    if algorithm != ALGORITHM or not key or not encoded:
        raise ValueError(f"not {ALGORITHM}:<key id>:<base64>")
    try:
        signature = binascii.a2b_base64(encoded.encode())
    except binascii.Error as err:
        raise ValueError(f"its signature is not base64: {err}") from err
    if len(signature) != 64:
        raise ValueError(f"an Ed25519 signature has 64 bytes, this one {len(signature)}")
    return key, signature


def verify_signature(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether `signature` is `public`'s Ed25519 signature of `message` (imports `cryptography`)."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(public).verify(signature, message)
    except InvalidSignature:
        return False
    return True


def default_receipts_folder() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "enginecache", f"verified-{os.geteuid()}")


class Receipts:
    """The folder of receipts of signatures this user verified (module docstring). Used only while
    it is owned by this user and writable by no one else."""

    __slots__ = ("folder",)

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def _path(self, public: bytes, signature: bytes, message: bytes) -> str:
        name = blake3.blake3(_RECEIPT_DOMAIN + public + signature + message).hexdigest()
        return os.path.join(self.folder, name)

    def _private(self) -> bool:
        try:
            st = os.stat(self.folder)
        except OSError:
            return False
        return st.st_uid == os.geteuid() and not st.st_mode & 0o022

    def holds(self, public: bytes, signature: bytes, message: bytes) -> bool:
        """Whether this user verified `signature` over `message` with `public` before."""
        if not self._private():
            return False
        try:
            st = os.stat(self._path(public, signature, message))
        except OSError:
            return False
        return st.st_uid == os.geteuid()

    def add(self, public: bytes, signature: bytes, message: bytes) -> None:
        """Keep the receipt of a signature just verified (a folder that cannot be made private, or
        written, keeps none: the next check verifies again)."""
        self._keep(self._path(public, signature, message))

    def _keep(self, path: str) -> None:
        try:
            os.makedirs(self.folder, mode=0o700, exist_ok=True)
            if not self._private():
                return
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.close(fd)
        except OSError:
            return

    def _stat_path(self, hostname: str, path: str, files: object, digest: str) -> str:
        text = json.dumps([hostname, path, files, digest], separators=(",", ":"))
        return os.path.join(self.folder, blake3.blake3(_STAT_DOMAIN + text.encode()).hexdigest())

    def holds_digest(self, hostname: str, path: str, files: object, digest: str) -> bool:
        """Whether this user hashed the model at `path` (its files' stat entries `files`) to `digest`
        itself: a stat cache row, which whoever can write the catalog can edit, is trusted only with
        this receipt where keys are trusted."""
        if not self._private():
            return False
        try:
            st = os.stat(self._stat_path(hostname, path, files, digest))
        except OSError:
            return False
        return st.st_uid == os.geteuid()

    def add_digest(self, hostname: str, path: str, files: object, digest: str) -> None:
        """Keep the receipt of a model this user just hashed (see `holds_digest`)."""
        self._keep(self._stat_path(hostname, path, files, digest))


def receipts(env: Mapping[str, str] | None = None) -> Receipts | None:
    """The receipts folder `ENGINECACHE_SIGNATURE_RECEIPTS` names (default
    `default_receipts_folder()`); None for `off`."""
    value = (os.environ if env is None else env).get(RECEIPTS_ENV)
    if value is not None and value.strip().lower() in _OFF:
        return None
    return Receipts(value.strip() if value and value.strip() else default_receipts_folder())


class Policy:
    """What this process checks: the trusted keys, and where receipts of verified signatures live."""

    __slots__ = ("keys", "receipts")

    def __init__(self, keys: TrustedKeys, kept: Receipts | None) -> None:
        self.keys = keys
        self.receipts = kept


def stat_receipts(env: Mapping[str, str] | None = None) -> Receipts | None:
    """The receipts a stat cache row must have to be trusted: where keys are trusted (the setting
    is read, its files are not) and receipts are kept; None otherwise (the row is trusted by its
    stat entries alone, as without signing)."""
    source = os.environ if env is None else env
    if not source.get(TRUSTED_KEYS_ENV, "").strip():
        return None
    return receipts(source)


def policy(env: Mapping[str, str] | None = None) -> Policy | None:
    """This process's policy, None where no trusted keys are configured (nothing is checked);
    SigningKeyError for a setting that names no usable key."""
    keys = trusted_keys(env)
    return None if keys is None else Policy(keys, receipts(env))


def signature_key_id(signature: str | None) -> str | None:
    """The key id a stored signature names (None where there is none, or it is malformed)."""
    try:
        return parse_signature(signature)[0] if signature else None
    except ValueError:
        return None


def check_statement(
    text: str | None,
    signature: str | None,
    *,
    row: Mapping[str, Any],
    request: Mapping[str, Any],
    checks: Policy,
    label: str,
) -> dict[str, Any]:
    """The decoded statement, where a trusted key signed `text` and it agrees with `row`
    (`row_expectations`) and `request` (dotted paths into the statement -> what the caller asked
    for); else ProvenanceError, in the order the module docstring gives."""
    if not text or not signature:
        raise ProvenanceError(
            f"{label} is not signed, and this host loads only engines a trusted key signed "
            f"({TRUSTED_KEYS_ENV}): {SIGN_REMEDY}",
            verdict=UNTRUSTED,
        )
    try:
        key, raw = parse_signature(signature)
    except ValueError as err:
        raise ProvenanceError(
            f"{label} is TAMPERED: its signature is malformed ({err})", verdict=TAMPERED, row_changed=True
        ) from err
    public = checks.keys.get(key)
    if public is None:
        raise ProvenanceError(
            f"{label} is signed by key {key}, which this host does not trust (trusted: {checks.keys.describe()}); "
            f"add the key to {TRUSTED_KEYS_ENV} if it is yours, or {SIGN_REMEDY}",
            verdict=UNTRUSTED,
        )
    message = text.encode()
    kept = checks.receipts
    if kept is None or not kept.holds(public, raw, message):
        if not verify_signature(public, raw, message):
            raise ProvenanceError(
                f"{label} is TAMPERED: its signature by key {key} does not verify over its statement",
                verdict=TAMPERED,
                row_changed=True,
            )
        if kept is not None:
            kept.add(public, raw, message)
    try:
        statement = json.loads(text)
    except ValueError as err:
        raise ProvenanceError(
            f"{label} is TAMPERED: its statement is not JSON", verdict=TAMPERED, row_changed=True
        ) from err
    if not isinstance(statement, dict) or statement.get("format") != STATEMENT_FORMAT or statement.get("key_id") != key:
        raise ProvenanceError(
            f"{label}: its signed statement is not a {STATEMENT_FORMAT} statement by key {key}",
            verdict=TAMPERED,
            row_changed=True,
        )
    changed = mismatches(statement, row, what="the row says")
    if changed:
        raise ProvenanceError(
            f"{label} is TAMPERED: its row no longer says what was signed ({'; '.join(changed)})",
            verdict=TAMPERED,
            row_changed=True,
        )
    asked = mismatches(statement, request, what="the request asks")
    if asked:
        raise ProvenanceError(
            f"{label} was refused: it was signed for another request ({'; '.join(asked)})", verdict=TAMPERED
        )
    return statement
