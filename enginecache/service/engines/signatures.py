"""Engines' signed provenance in the catalog (`core.signing` owns the statement, keys and check):
checking a row for `verify`, `check` and `pull`, marking one TAMPERED, and `verify --sign`.

- `check_row` checks an engine row's statement against the row, the model row it belongs to and what
  the caller asked for (`pull`: the model it resolved), and that the statement's cache key is the key
  of its own ingredients. A row that no longer says what was signed is marked TAMPERED (audited, `by`
  the caller), then ProvenanceError is raised; an unsigned engine, or one signed by a key not trusted
  here, raises ProvenanceError UNTRUSTED and keeps its status. Without trusted keys
  (`ENGINECACHE_TRUSTED_KEYS` unset) nothing is checked: `describe` says what is recorded.
- `sign_row` (an admin's `verify --sign`, after the blob was re-hashed against the row): signs an
  unsigned engine, or re-signs with this pool's key one whose signature a trusted key made (key
  rotation); never one whose statement does not verify, and never silently: each signature is
  audited `engine.signed`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enginecache.core.cachekey import compute_cache_key
from enginecache.core.signing import (
    SIGNING_KEY_ENV,
    TAMPERED,
    TRUSTED_KEYS_ENV,
    Policy,
    SigningKey,
    check_statement,
    engine_statement,
    generate_key,
    policy,
    row_expectations,
    signature_key_id,
    signing_key,
    statement_text,
    trusted_keys,
)
from enginecache.core.verdicts import Verdict
from enginecache.db import engines
from enginecache.db.models import EngineRecord, ModelRecord
from enginecache.errors import NotFoundError, ProvenanceError, SigningKeyError
from enginecache.service.access import audit
from enginecache.service.access import roles as access
from enginecache.service.context import AppContext

SIGNABLE = ("READY", "UNPROVEN")  # the statuses `verify --sign` signs


def _model(app: AppContext, engine: EngineRecord) -> ModelRecord:
    with app.catalog.read() as session:
        model = session.get(ModelRecord, engine.model_id)
    if model is None:
        raise NotFoundError(f"engine {engine.id}'s model {engine.model_id} is not in the catalog")
    return model


def _row(engine: EngineRecord) -> dict[str, Any]:
    return row_expectations(engine.model_dump())


def check_row(
    app: AppContext, engine: EngineRecord, checks: Policy, *, by: str, request: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The engine's statement, decoded, where a trusted key signed it and it agrees with the row, its
    model row (`models.digest`), `request` and its own ingredients' cache key; else ProvenanceError,
    the engine marked TAMPERED (audited as found `by` the caller) where its row changed."""
    model = _model(app, engine)
    asked = {"model.digest": model.digest, **(request or {})}
    label = f"engine {engine.id}"
    try:
        statement = check_statement(
            engine.signed_statement, engine.signature, row=_row(engine), request=asked, checks=checks, label=label
        )
        try:
            own_key = compute_cache_key(statement.get("ingredients") or {})
        except (ValueError, TypeError) as err:
            own_key = f"none ({err})"
        if own_key != statement.get("cache_key"):
            raise ProvenanceError(
                f"{label} is TAMPERED: its signed cache key {statement.get('cache_key')} is not the key of its "
                f"signed ingredients ({own_key})",
                verdict=TAMPERED,
                row_changed=True,
            )
    except ProvenanceError as err:
        if err.row_changed:
            with app.catalog.changes() as ex:
                engines.mark_tampered(ex, engine.id or 0, actor=audit.current_actor(), by=by, reason=str(err))
        raise
    return statement


def describe(engine: EngineRecord) -> str:
    """What is recorded, where nothing is checked (no trusted keys here)."""
    key = signature_key_id(engine.signature)
    if key is None:
        return "unsigned"
    return f"signed by key {key} (not checked: ENGINECACHE_TRUSTED_KEYS is not set here)"


@dataclass(frozen=True)
class SignOutcome:
    engine_id: int
    signed: bool
    message: str


def _first_origin(engine: EngineRecord) -> dict[str, Any]:
    """Who made an engine signed after the fact: its importer where `engine import` recorded one (its
    `provenance`), else an admin's `verify --sign` vouching for a build from before signing."""
    recorded = dict(getattr(engine, "provenance", None) or {})
    if recorded.get("kind") == "imported":
        return {"kind": "imported", "imported_by": recorded.get("by"), "source": recorded.get("source")}
    return {"kind": "signed", "note": "built before signing; signed by an admin's verify --sign"}


def sign_row(
    app: AppContext, engine: EngineRecord, key: SigningKey, checks: Policy | None, *, by: str = "verify --sign"
) -> SignOutcome:
    """Sign `engine` with `key` (module docstring): its blob must have been re-hashed against the row
    by the caller (`by`: what signs it, for the audit row: `verify --sign`, `engine import`). An
    engine signed already is re-signed only where `checks` shows its signature by a trusted key
    other than `key` still vouches for the row (rotation); one its own key signed is left as it is.
    Raises ProvenanceError where the existing signature does not vouch for it."""
    engine_id = engine.id or 0
    if engine.status not in SIGNABLE:
        return SignOutcome(engine_id, False, f"not signed: it is {engine.status}")
    origin: dict[str, Any]
    if engine.signature:
        current = signature_key_id(engine.signature)
        if current == key.key_id:
            return SignOutcome(engine_id, False, f"signed by this pool's key {key.key_id} already")
        if checks is None:
            return SignOutcome(
                engine_id, False, f"not re-signed: signed by key {current}, and no trusted keys here to check it"
            )
        previous = check_row(app, engine, checks, by="verify")
        origin = {**dict(previous.get("origin") or {}), "resigned_from": previous.get("key_id")}
    else:
        origin = _first_origin(engine)
    model = _model(app, engine)
    if engine.onnx_digest != model.digest:
        raise ProvenanceError(
            f"engine {engine_id} not signed: its onnx_digest {engine.onnx_digest} is not its model's "
            f"digest {model.digest}",
            verdict=TAMPERED,
        )
    if compute_cache_key(engine.key_ingredients) != engine.cache_key:
        raise ProvenanceError(
            f"engine {engine_id} not signed: its cache key is not the key of its recorded ingredients",
            verdict=TAMPERED,
        )
    actor = audit.current_actor()
    statement = engine_statement(
        sha256=str(engine.sha256),
        blake3_digest=engine.blake3,
        header_blake3=engine.header_blake3,
        chunk_blake3=engine.chunk_blake3,
        size_bytes=int(engine.size_bytes or 0),
        cache_key=engine.cache_key,
        ingredients=engine.key_ingredients,
        model_digest=model.digest,
        model_name=model.name,
        backend=engine.backend,
        backend_version=engine.backend_version,
        precision=engine.precision,
        targets=engine.targets,
        origin={**origin, "signed_by": actor.name},
        key=key.key_id,
        signed_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    text = statement_text(statement)
    with app.catalog.changes() as ex:
        engines.record_signature(
            ex,
            engine_id,
            statement=text,
            signature=key.sign(text),
            actor=actor,
            by=by,
            details={"key_id": key.key_id, "resigned_from": origin.get("resigned_from")},
        )
    again = "re-signed" if engine.signature else "signed"
    return SignOutcome(engine_id, True, f"{again} by key {key.key_id}")


# -- what `verify` and `check` ask ----------------------------------------------------------------


def verify_setup(app: AppContext, *, sign: bool) -> tuple[Policy | None, SigningKey | None]:
    """This process's trusted keys (None: nothing is checked) and, for `verify --sign`, the pool's
    signing key: signing needs the admin role and `ENGINECACHE_SIGNING_KEY` (SigningKeyError
    without it, before anything is read)."""
    checks = policy()
    if not sign:
        return checks, None
    access.require(app, "sign")
    key = signing_key()
    if key is None:
        raise SigningKeyError(f"verify --sign needs the pool's private key: set {SIGNING_KEY_ENV} to its file")
    return checks, key


def tampered_row(app: AppContext, engine: EngineRecord, checks: Policy | None) -> str | None:
    """Where trusted keys are configured and the row no longer says what was signed: why (the engine
    is now marked TAMPERED, and `verify` reads nothing more of it). None otherwise (an unsigned or
    untrusted engine is `after_blob`'s to report)."""
    if checks is None:
        return None
    try:
        check_row(app, engine, checks, by="verify")
    except ProvenanceError as err:
        return str(err) if err.row_changed else None
    return None


@dataclass(frozen=True)
class SignatureNote:
    ok: bool
    message: str
    status: str | None = None  # the engine's status where this step changed it


def after_blob(app: AppContext, engine_id: int, checks: Policy | None, key: SigningKey | None) -> SignatureNote:
    """`verify`'s signature step once the blob matched its row: sign it where `key` is given (an
    admin's `verify --sign`: `sign_row`), then check it where trusted keys are configured (a TAMPERED
    engine whose row, statement and blob agree again goes back to READY, audited), else say what is
    recorded."""
    engine = _engine(app, engine_id)
    signed = ""
    try:
        if key is not None:
            signed = sign_row(app, engine, key, checks).message + "; "
            engine = _engine(app, engine_id)
        if checks is None:
            return SignatureNote(True, f"signature: {signed}{describe(engine)}")
        statement = check_row(app, engine, checks, by="verify")
    except ProvenanceError as err:
        return SignatureNote(False, f"signature: {signed}{err}", engines.TAMPERED if err.row_changed else None)
    status = None
    if engine.status == engines.TAMPERED:
        with app.catalog.changes() as ex:
            engines.mark_signature_verified(
                ex, engine_id, actor=audit.current_actor(), by="verify", reason="its row, statement and blob agree"
            )
        status = _engine(app, engine_id).status
    return SignatureNote(True, f"signature: {signed}verified (key {statement.get('key_id')})", status)


def check_refusal(app: AppContext, engine: EngineRecord) -> tuple[Verdict, str] | None:
    """`check`'s signature step, before the blob is read: (TAMPERED or UNTRUSTED, why) where trusted
    keys are configured and none vouches for the engine (a changed row is marked TAMPERED), else
    None."""
    checks = policy()
    if checks is None:
        return None
    try:
        check_row(app, engine, checks, by="check")
    except ProvenanceError as err:
        return Verdict(err.verdict.lower()), str(err)
    return None


def check_note(engine: EngineRecord) -> str:
    """What `check` adds to its reason about the signature: verified, or what is recorded where no
    trusted keys are configured."""
    if policy() is None:
        return f"signature: {describe(engine)}"
    return f"signature: verified (key {signature_key_id(engine.signature)})"


def _engine(app: AppContext, engine_id: int) -> EngineRecord:
    with app.catalog.read() as session:
        found = session.get(EngineRecord, engine_id)
    if found is None:
        raise NotFoundError(f"no engine with id {engine_id} in the catalog")
    return found


# -- keys (`enginecache keys`) --------------------------------------------------------------------


def generate_keys(folder: Path, name: str) -> dict[str, str]:
    """A new Ed25519 key pair in `folder` (`core.signing.generate_key`): the files, the key id and the
    settings that use them."""
    private, public, key = generate_key(folder, name)
    return {
        "key_id": key,
        "private_key": private,
        "public_key": public,
        "signing_setting": f"{SIGNING_KEY_ENV}={private}",
        "trust_setting": f"{TRUSTED_KEYS_ENV}={public}",
    }


def key_status() -> dict[str, Any]:
    """This process's keys: the signing key's id and file (None: it signs nothing) and each trusted
    key's id and file (an empty list: nothing is checked)."""
    key = signing_key()
    trusted = trusted_keys()
    return {
        "signing_key": None if key is None else {"key_id": key.key_id, "file": key.path},
        "trusted_keys": []
        if trusted is None
        else [{"key_id": k, "file": trusted.sources[k]} for k in sorted(trusted.keys)],
        "checked": trusted is not None,
    }
