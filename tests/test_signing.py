"""Signed engine provenance (core.signing): a build pool's Ed25519 key signs a statement binding an
engine's bytes to its cache key, model, backend, version, precision and targets; where hosts trust
keys, an engine row swapped for another's (issue 27: engine 2's digests, header digest, blob path and
size copied into engine 1's row, its signature along or not), one re-pointed at other bytes, or one
re-signed with a key nobody trusts is refused on the hit path, the full path, `pull`, `verify` and
`check` before a runtime sees a byte, and a changed row is marked TAMPERED (audited). Real keys
(`cryptography`), real ORT engines, a real catalog."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select

from enginecache.core import signing
from enginecache.core.backends.registry import get_backend
from enginecache.core.verdicts import Verdict
from enginecache.db.models import AuditEventRecord, EngineStatus
from enginecache.errors import AccessDeniedError, EngineRejectedError, ProvenanceError, SigningKeyError
from enginecache.service.access.audit import Actor, acting_as
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import check_engine, get_engine, verify_engines
from enginecache.service.fleet.pull import manifest_path, pull
from enginecache.service.models.register import get_model, register_model
from enginecache.service.serving import loadpath, memo
from enginecache.service.serving.runtime import load_or_build
from tests.clirunner import run_cli
from tests.modelfactory import make_mlp
from tests.servingkit import ORT, Served, age, load_through, loaded_modules, refuse

PATHS = ["hit", "full", "pull", "verify", "check"]


class Keys:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pool = signing.generate_key(folder, "pool")  # (private, public, key id)
        self.rogue = signing.generate_key(folder / "rogue", "rogue")
        self.receipts = folder / "receipts"


@pytest.fixture
def keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Keys:
    """A pool key and a rogue key; this process signs with the pool's and trusts it alone (receipts
    in a folder of the test's own)."""
    made = Keys(tmp_path / "keys")
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, made.pool[0])
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, made.pool[1])
    monkeypatch.setenv(signing.RECEIPTS_ENV, str(made.receipts))
    return made


def _serve(app: AppContext, folder: Path, name: str, seed: int, *, also: tuple[str, ...] = ()) -> Served:
    """`servingkit.serve_mlp` of a model of its own bytes (`seed`): registered, built (and built in
    the precisions `also` names), loaded once (the stat cache and memo the hit path reads)."""
    onnx_path = make_mlp(folder / f"{name}.onnx", seed=seed)
    age(onnx_path)
    register_model(app, onnx_path, name=name)
    for precision in also:
        build_engine(app, BuildRequest(model=name, backend="ort", precision=precision))
    engine = build_engine(app, BuildRequest(model=name, backend="ort")).engine
    memo.code_identity.cache_clear()
    first = load_or_build(onnx_path, spec=ORT, app=app, on_miss="fail")
    assert first.via == "fullpath"
    first.close()
    return Served(app, onnx_path, engine)


@pytest.fixture
def two(app_ctx: AppContext, tmp_path: Path, keys: Keys) -> tuple[Served, Served]:
    """Two models ("mobilenet", "resnet"), each with its signed ORT engine, each served once."""
    return _serve(app_ctx, tmp_path / "src", "mobilenet", 0), _serve(app_ctx, tmp_path / "src", "resnet", 1)


BLOB_COLUMNS = ("sha256", "blake3", "header_blake3", "chunk_blake3", "blob_path", "size_bytes")
SIGNED_COLUMNS = ("signed_statement", "signature")


def _copy_columns(app: AppContext, source: int, target: int, columns: tuple[str, ...]) -> None:
    """What an attacker with write access to the catalog does: the columns of row `source` written
    into row `target`, with the stdlib's sqlite3 (no enginecache code involved)."""
    connection = sqlite3.connect(app.home / "catalog.db")
    try:
        values = connection.execute(f"SELECT {', '.join(columns)} FROM engines WHERE id = ?", (source,)).fetchone()
        sets = ", ".join(f"{c} = ?" for c in columns)
        connection.execute(f"UPDATE engines SET {sets} WHERE id = ?", (*values, target))
        connection.commit()
    finally:
        connection.close()


def _set_columns(app: AppContext, engine_id: int, **values: Any) -> None:
    connection = sqlite3.connect(app.home / "catalog.db")
    try:
        sets = ", ".join(f"{c} = ?" for c in values)
        connection.execute(f"UPDATE engines SET {sets} WHERE id = ?", (*values.values(), engine_id))
        connection.commit()
    finally:
        connection.close()


def _no_runtime_sees_a_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = type(get_backend("ort"))
    for name in ("check_header", "load", "load_file"):
        monkeypatch.setattr(backend, name, refuse(f"ORT's {name} was handed the engine's bytes"))


def _resign_with(app: AppContext, engine_id: int, private: str, *, claim: str | None = None) -> None:
    """The row's statement edited to say what the row now says, signed with the key in `private`
    (`claim`: the key id its signature names instead of the key's own)."""
    engine = get_engine(app, engine_id)
    statement = json.loads(engine.signed_statement or "{}")
    statement["engine"] = {
        "sha256": engine.sha256,
        "blake3": engine.blake3,
        "header_blake3": engine.header_blake3,
        "chunk_blake3": engine.chunk_blake3 or None,
        "size_bytes": engine.size_bytes,
    }
    key = signing.load_signing_key(private)
    statement["key_id"] = claim or key.key_id
    text = signing.statement_text(statement)
    signature = key.sign(text)
    if claim is not None:
        signature = signature.replace(key.key_id, claim)
    _set_columns(app, engine_id, signed_statement=text, signature=signature)


def _attempt(path: str, served: Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """One use of `served`'s engine through `path`: (the verdict that refused it, why). Fails the
    test where nothing refused it."""
    app, engine_id = served.app, served.engine.id or 0
    if path in ("hit", "full"):
        with pytest.raises(EngineRejectedError) as rejected:
            load_through(served, ORT, path, monkeypatch)
        assert rejected.value.engine_id == engine_id
        return rejected.value.verdict, str(rejected.value)
    if path == "pull":
        dest = tmp_path / "pulled"
        with pytest.raises(ProvenanceError) as refused:
            pull(app, "mobilenet", dest)
        assert not (dest / "objects").exists() and not manifest_path(dest, "mobilenet").exists(), "nothing copied"
        return refused.value.verdict, str(refused.value)
    if path == "verify":
        (result,) = verify_engines(app, [engine_id])
        assert not result.ok
        return ("TAMPERED" if result.status == EngineStatus.TAMPERED else "UNTRUSTED"), result.message
    checked = check_engine(app, engine_id)
    assert checked.verdict in (Verdict.TAMPERED, Verdict.UNTRUSTED)
    return checked.verdict.outcome, checked.reason


def _tampered_audit(app: AppContext, engine_id: int) -> list[AuditEventRecord]:
    query = select(AuditEventRecord).where(
        AuditEventRecord.action == "engine.tampered", AuditEventRecord.target == f"engine {engine_id}"
    )
    with app.catalog.read() as session:
        return list(session.exec(query.order_by(col(AuditEventRecord.id))).all())


# -- the attacks ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_row_swapped_with_its_signature_copied_along_is_refused_and_marked_tampered(
    two: tuple[Served, Served], path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's attack, its signature copied too: resnet's blob, digests and signed statement in
    mobilenet's row. The statement is genuine, but for another model and cache key."""
    mobilenet, resnet = two
    app, victim = mobilenet.app, mobilenet.engine.id or 0
    _copy_columns(app, resnet.engine.id or 0, victim, BLOB_COLUMNS + SIGNED_COLUMNS)
    _no_runtime_sees_a_byte(monkeypatch)
    verdict, why = _attempt(path, mobilenet, tmp_path, monkeypatch)
    assert verdict == "TAMPERED", why
    assert "model.digest" in why and "cache_key" in why, why
    assert get_engine(app, victim).status == EngineStatus.TAMPERED
    (audited,) = _tampered_audit(app, victim)
    assert audited.details["was"] == "READY" and audited.details["by"] in ("load_or_build", "pull", "verify", "check")
    assert get_engine(app, resnet.engine.id or 0).status == EngineStatus.READY, "the genuine engine is left alone"


@pytest.mark.parametrize("path", PATHS)
def test_a_row_swapped_under_its_own_signature_is_refused(
    two: tuple[Served, Served], path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's attack as written: only the digests, header digest, blob path and size copied;
    mobilenet's own statement no longer names the bytes its row points at."""
    mobilenet, resnet = two
    _copy_columns(mobilenet.app, resnet.engine.id or 0, mobilenet.engine.id or 0, BLOB_COLUMNS)
    _no_runtime_sees_a_byte(monkeypatch)
    verdict, why = _attempt(path, mobilenet, tmp_path, monkeypatch)
    assert verdict == "TAMPERED" and "engine.sha256" in why, why
    assert get_engine(mobilenet.app, mobilenet.engine.id or 0).status == EngineStatus.TAMPERED


@pytest.mark.parametrize("path", PATHS)
def test_a_swap_re_signed_with_a_key_nobody_trusts_is_refused(
    two: tuple[Served, Served], path: str, tmp_path: Path, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The swap with a statement rewritten to fit the row, signed with the attacker's own key: refused
    as UNTRUSTED (the key is named; the row keeps its status: a key nobody trusts proves nothing)."""
    mobilenet, resnet = two
    victim = mobilenet.engine.id or 0
    _copy_columns(mobilenet.app, resnet.engine.id or 0, victim, BLOB_COLUMNS)
    _resign_with(mobilenet.app, victim, keys.rogue[0])
    _no_runtime_sees_a_byte(monkeypatch)
    verdict, why = _attempt(path, mobilenet, tmp_path, monkeypatch)
    assert verdict == "UNTRUSTED" and keys.rogue[2] in why and "does not trust" in why, why
    assert get_engine(mobilenet.app, victim).status == EngineStatus.READY


@pytest.mark.parametrize("path", ["hit", "verify"])
def test_a_rogue_signature_that_names_the_pools_key_is_tampered(
    two: tuple[Served, Served], path: str, tmp_path: Path, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attacker's signature labelled with the pool's key id: it does not verify under that key."""
    mobilenet, resnet = two
    victim = mobilenet.engine.id or 0
    _copy_columns(mobilenet.app, resnet.engine.id or 0, victim, BLOB_COLUMNS)
    _resign_with(mobilenet.app, victim, keys.rogue[0], claim=keys.pool[2])
    _no_runtime_sees_a_byte(monkeypatch)
    verdict, why = _attempt(path, mobilenet, tmp_path, monkeypatch)
    assert verdict == "TAMPERED" and "does not verify" in why, why
    assert get_engine(mobilenet.app, victim).status == EngineStatus.TAMPERED


@pytest.mark.parametrize("path", ["hit", "full"])
def test_a_row_re_pointed_at_its_models_other_engine_is_refused(
    app_ctx: AppContext, tmp_path: Path, keys: Keys, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fp16 engine of the same model (its bytes and its genuine statement) behind the fp32 row:
    same model, so the model digest agrees; the precision and the cache key do not."""
    served = _serve(app_ctx, tmp_path / "src", "mobilenet", 0, also=("fp16",))
    fp16 = build_engine(app_ctx, BuildRequest(model="mobilenet", backend="ort", precision="fp16")).engine  # found
    _copy_columns(app_ctx, fp16.id or 0, served.engine.id or 0, BLOB_COLUMNS + SIGNED_COLUMNS)
    _no_runtime_sees_a_byte(monkeypatch)
    verdict, why = _attempt(path, served, tmp_path, monkeypatch)
    assert verdict == "TAMPERED" and "precision" in why and "cache_key" in why, why


def test_the_pulled_folder_is_checked_again_at_the_serving_start(
    two: tuple[Served, Served], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pull carries the statement and signature; a manifest edited to name the other model's engine
    (its statement copied along) is refused by `load_or_build(manifest)`; the genuine one loads."""
    mobilenet, resnet = two
    dest = tmp_path / "pulled"
    pulled = pull(mobilenet.app, "mobilenet", dest)
    assert pulled.manifest["engine"]["signature"] == mobilenet.engine.signature
    with load_or_build(pulled.manifest_path, spec=ORT) as loaded:
        assert loaded.via == "pulled"
    other = pull(resnet.app, "resnet", dest)
    manifest = json.loads(pulled.manifest_path.read_text())
    manifest["engine"] = {**json.loads(other.manifest_path.read_text())["engine"], "id": mobilenet.engine.id}
    manifest["blob"] = other.manifest["blob"]
    pulled.manifest_path.write_text(json.dumps(manifest))
    _no_runtime_sees_a_byte(monkeypatch)
    with pytest.raises(EngineRejectedError) as refused:
        load_or_build(pulled.manifest_path, spec=ORT)
    assert refused.value.verdict == "TAMPERED" and "model.digest" in str(refused.value)
    manifest["model"] = {**manifest["model"], "digest": other.manifest["model"]["digest"]}  # the model too
    pulled.manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(EngineRejectedError) as refused:
        load_or_build(pulled.manifest_path, spec=ORT)
    assert refused.value.verdict == "TAMPERED" and 'model.name: signed "resnet"' in str(refused.value)


# -- unsigned engines, `verify --sign`, rotation ------------------------------------------------------


def test_without_keys_nothing_changes_and_check_and_verify_say_unsigned(
    app_ctx: AppContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in (signing.SIGNING_KEY_ENV, signing.TRUSTED_KEYS_ENV):
        monkeypatch.delenv(name, raising=False)
    served = _serve(app_ctx, tmp_path / "src", "mobilenet", 0)
    assert served.engine.signature is None and served.engine.signed_statement is None
    with load_through(served, ORT, "hit", monkeypatch) as loaded:
        assert loaded.engine_id == served.engine.id
    cli = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    checked = run_cli(capsys, *cli, "check", str(served.engine.id))
    assert checked.code == 0 and "signature: unsigned" in checked.out, checked.out + checked.err
    verified = run_cli(capsys, *cli, "verify", "--all", "--json")
    assert verified.code == 0, verified.err
    (engine,) = [r for r in verified.json() if r["kind"] == "engine"]
    assert engine["ok"] and "signature: unsigned" in engine["message"]


def test_unsigned_engines_are_refused_where_keys_are_trusted_until_an_admin_signs_them(
    app_ctx: AppContext,
    tmp_path: Path,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Engines built before signing are never trusted silently: refused (UNTRUSTED, with the remedy)
    on both paths, then signed by an admin's `verify --all --sign`, then served; a user without the
    admin role may not sign."""
    monkeypatch.delenv(signing.SIGNING_KEY_ENV)
    with monkeypatch.context() as before:
        before.delenv(signing.TRUSTED_KEYS_ENV)
        served = _serve(app_ctx, tmp_path / "src", "mobilenet", 0)
    assert served.engine.signature is None
    for path in ("full", "hit"):  # the full path hashes the model again (its stat entry had no receipt)
        with pytest.raises(EngineRejectedError) as refused:
            load_through(served, ORT, path, monkeypatch)
        assert refused.value.verdict == "UNTRUSTED" and "verify --sign" in str(refused.value)
    assert get_engine(app_ctx, served.engine.id or 0).status == EngineStatus.READY, "not marked: only unsigned"

    cli = ["--home", str(app_ctx.home), "--db", app_ctx.db_url]
    unsigned = run_cli(capsys, *cli, "verify", "--all", "--json")
    assert unsigned.code == 1 and "verify --sign" in unsigned.out
    no_key = run_cli(capsys, *cli, "verify", "--all", "--sign")
    assert no_key.code == 2 and signing.SIGNING_KEY_ENV in no_key.err
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, keys.pool[0])
    with acting_as(Actor("bob@example.com", "dashboard 10.0.0.5")), pytest.raises(AccessDeniedError):
        verify_engines(app_ctx, sign=True)
    signed = run_cli(capsys, *cli, "verify", "--all", "--sign", "--json")
    assert signed.code == 0, signed.out + signed.err
    (engine,) = [r for r in signed.json() if r["kind"] == "engine"]
    assert f"signed by key {keys.pool[2]}" in engine["message"] and "verified" in engine["message"]
    row = get_engine(app_ctx, served.engine.id or 0)
    statement = json.loads(row.signed_statement or "")
    assert statement["origin"]["kind"] == "signed" and statement["model"]["name"] == "mobilenet"
    with app_ctx.catalog.read() as session:
        audited = session.exec(select(AuditEventRecord).where(AuditEventRecord.action == "engine.signed")).all()
    assert [a.target for a in audited] == [f"engine {served.engine.id}"]
    for path in ("full", "hit"):  # the full path wrote the memo the hit reads again
        with load_through(served, ORT, path, monkeypatch) as loaded:
            assert loaded.engine_id == served.engine.id


def test_rotation_re_signs_with_the_new_key_and_the_old_one_can_then_go(
    app_ctx: AppContext, tmp_path: Path, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    served = _serve(app_ctx, tmp_path / "src", "mobilenet", 0)
    new = signing.generate_key(keys.folder, "pool-2")
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, os.pathsep.join([keys.pool[1], new[1]]))
    monkeypatch.setenv(signing.SIGNING_KEY_ENV, new[0])
    (result,) = verify_engines(app_ctx, sign=True)
    assert result.ok and f"re-signed by key {new[2]}" in result.message, result.message
    statement = json.loads(get_engine(app_ctx, served.engine.id or 0).signed_statement or "")
    assert statement["origin"]["kind"] == "built" and statement["origin"]["resigned_from"] == keys.pool[2]
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, new[1])  # the old key retired
    with load_through(served, ORT, "full", monkeypatch) as loaded:
        assert loaded.engine_id == served.engine.id
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, keys.pool[1])  # a host that trusts only the old key
    with pytest.raises(EngineRejectedError) as refused:
        load_through(served, ORT, "hit", monkeypatch)
    assert refused.value.verdict == "UNTRUSTED" and new[2] in str(refused.value)


def test_a_restored_row_is_ready_again_after_verify(
    two: tuple[Served, Served], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mobilenet, resnet = two
    app, victim = mobilenet.app, mobilenet.engine.id or 0
    original = get_engine(app, victim)
    _copy_columns(app, resnet.engine.id or 0, victim, BLOB_COLUMNS)
    assert _attempt("check", mobilenet, tmp_path, monkeypatch)[0] == "TAMPERED"
    assert check_engine(app, victim).verdict == Verdict.TAMPERED, "a TAMPERED engine stays refused"
    _set_columns(app, victim, **{c: getattr(original, c) for c in BLOB_COLUMNS})
    (result,) = verify_engines(app, [victim])
    assert result.ok and result.status == EngineStatus.READY, result.message
    with app.catalog.read() as session:
        actions = [a.action for a in session.exec(select(AuditEventRecord).order_by(col(AuditEventRecord.id)))]
    assert actions[-2:] == ["engine.tampered", "engine.ready"]


# -- keys, receipts, the hit path's imports -------------------------------------------------------


def test_keys_are_refused_clearly(tmp_path: Path, keys: Keys, monkeypatch: pytest.MonkeyPatch) -> None:
    private = Path(keys.pool[0])
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    with pytest.raises(SigningKeyError, match="exists already"):
        signing.generate_key(keys.folder, "pool")
    private.chmod(0o644)
    with pytest.raises(SigningKeyError, match="chmod 600"):
        signing.load_signing_key(private)
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, str(tmp_path / "missing.pub"))
    with pytest.raises(SigningKeyError, match="does not exist"):
        signing.policy()
    not_a_key = tmp_path / "x.pub"
    not_a_key.write_text("hello\n")
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, str(not_a_key))
    with pytest.raises(SigningKeyError, match="no PEM PUBLIC KEY"):
        signing.policy()
    monkeypatch.setenv(signing.TRUSTED_KEYS_ENV, str(keys.folder))  # a folder: pool.pub, pool-less rogue/
    checks = signing.policy()
    assert checks is not None and list(checks.keys.keys) == [keys.pool[2]]


def test_a_receipt_spares_the_second_check_and_only_a_private_folder_keeps_one(
    keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = signing.load_signing_key(keys.pool[0])
    text = signing.statement_text({"format": signing.STATEMENT_FORMAT, "key_id": key.key_id, "x": 1})
    signature = key.sign(text)
    checks = signing.policy()
    assert checks is not None
    signing.check_statement(text, signature, row={"x": 1}, request={}, checks=checks, label="e")
    monkeypatch.setattr(signing, "verify_signature", refuse("the receipt was not used"))
    signing.check_statement(text, signature, row={"x": 1}, request={}, checks=checks, label="e")
    with pytest.raises(ProvenanceError, match="x: signed 1, the row says 2"):
        signing.check_statement(text, signature, row={"x": 2}, request={}, checks=checks, label="e")
    other = signing.statement_text({"format": signing.STATEMENT_FORMAT, "key_id": key.key_id, "x": 2})
    with pytest.raises(AssertionError, match="receipt"):  # another statement: no receipt, a real check
        signing.check_statement(other, signature, row={}, request={}, checks=checks, label="e")
    keys.receipts.chmod(0o777)
    with pytest.raises(AssertionError, match="receipt"):  # a folder others may write: its receipts ignored
        signing.check_statement(text, signature, row={}, request={}, checks=checks, label="e")


def test_the_signed_hit_of_a_new_process_imports_no_cryptography_once_verified(two: tuple[Served, Served]) -> None:
    mobilenet, _ = two
    code = (
        "from enginecache.service.serving.runtime import RuntimeSpec, load_or_build\n"
        f"loaded = load_or_build({str(mobilenet.onnx_path)!r}, spec=RuntimeSpec(backend='ort'),"
        f" home={str(mobilenet.app.home)!r}, on_miss='fail')\n"
        "assert loaded.via == 'hitpath', loaded.via\n"
    )
    assert loaded_modules(code, "cryptography") == [], "the receipt written when it was served once"


def _point_stat_cache(app: AppContext, onnx_path: Path, digest: str) -> None:
    """What an attacker with write access to the catalog does to the stat cache: the entry of
    `onnx_path` made to say another model's digest (its file stats left as they are)."""
    connection = sqlite3.connect(app.home / "catalog.db")
    try:
        changed = connection.execute(
            "UPDATE onnx_stat_cache SET digest = ? WHERE path = ?", (digest, os.path.abspath(onnx_path))
        ).rowcount
        connection.commit()
    finally:
        connection.close()
    assert changed == 1


def test_a_stat_cache_entry_pointed_at_another_models_digest_serves_the_right_engine(
    two: tuple[Served, Served], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where keys are trusted, a stat cache row counts only with this user's receipt of having
    hashed that file to that digest: model A's row edited to say B's digest is hashed again, and a
    request for A is served A's engine, on the hit path (which passes it to the full path) and on
    the full path, never B's genuinely signed one."""
    mobilenet, resnet = two
    _point_stat_cache(mobilenet.app, mobilenet.onnx_path, get_model(mobilenet.app, "resnet").digest)
    with monkeypatch.context() as patch:
        patch.setattr(loadpath, "load_or_build_full", refuse("the hit path took the full path"))
        with pytest.raises(AssertionError, match="took the full path"):
            load_or_build(mobilenet.onnx_path, spec=ORT, app=mobilenet.app, on_miss="fail")
    loaded = load_or_build(mobilenet.onnx_path, spec=ORT, app=mobilenet.app, on_miss="fail")
    try:
        assert loaded.engine_id == mobilenet.engine.id != resnet.engine.id
    finally:
        loaded.close()
    again = load_or_build(mobilenet.onnx_path, spec=ORT, app=mobilenet.app, on_miss="fail")  # hashed again: a hit
    try:
        assert again.via == "hitpath" and again.engine_id == mobilenet.engine.id
    finally:
        again.close()


def test_a_miss_after_the_exact_engine_was_found_tampered_names_it_and_the_fix(
    two: tuple[Served, Served], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the exact match is TAMPERED, the next lookup's miss names it, why it cannot serve, and
    the commands that restore it (issue 27, point 5), as it does for a CORRUPT one."""
    from enginecache.errors import MissError

    mobilenet, resnet = two
    victim = mobilenet.engine.id or 0
    _copy_columns(mobilenet.app, resnet.engine.id or 0, victim, BLOB_COLUMNS + SIGNED_COLUMNS)
    _attempt("full", mobilenet, tmp_path, monkeypatch)
    assert get_engine(mobilenet.app, victim).status == EngineStatus.TAMPERED
    with pytest.raises(MissError) as missed:
        load_or_build(mobilenet.onnx_path, spec=ORT, app=mobilenet.app, on_miss="fail")
    said = str(missed.value)
    assert f"engine {victim} is the exact match but TAMPERED" in said and "signed statement" in said, said
    assert f"enginecache verify {victim}" in said and "enginecache build mobilenet --backend ort" in said, said
    assert missed.value.nearest == {"id": victim, "status": "TAMPERED", "exact": True}
