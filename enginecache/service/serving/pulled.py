"""Loading an engine from a folder `enginecache pull` filled, with no catalog connection:
`load_or_build("DIR/manifests/MODEL.json", ...)`, what a serving pod does after its init container.

The manifest (`service.fleet.pull`) names the engine's digests; the blob is read from the path its sha256
implies under DIR (the folder is a store of its own) and verified in the pass that reads it, then
the backend checks its header and deserializes it (`service.serving.engineload`): a damaged blob is
EngineRejectedError CORRUPT, an engine this host cannot run INCOMPATIBLE, exactly as from the
catalog's store. A spec, where one is given, must agree with what was pulled (backend, precision);
`spec=None` takes the pulled engine as it is. Where a catalog is given (`db_url=`, or
$ENGINECACHE_DB_URL) the load event is recorded there as well, beside the start (a thread that
`close()`, or the interpreter's exit, waits for): a catalog that cannot be reached is logged and the
engine served at once all the same (the case pulling ahead is for). The same goes for engines baked
into an image with `enginecache pull` at image build time and a Dockerfile COPY of DIR.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from enginecache.core.backends.base import PhaseTimer
from enginecache.core.diskbudget import BlobHold
from enginecache.errors import BadInputError, EngineRejectedError
from enginecache.service.serving.engineload import EngineFacts, load_engine
from enginecache.service.serving.runtimetypes import LoadedEngine, RuntimeSpec

logger = logging.getLogger(__name__)

MANIFEST_FORMAT = "enginecache-pull-v1"  # what service.fleet.pull writes (it imports it from here: this side is light)


def is_pull_manifest(path: Path) -> bool:
    """Whether `path` is where `pull` writes a manifest (`DIR/manifests/<model>.json`)."""
    return path.suffix == ".json" and path.parent.name == "manifests"


def read_manifest(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BadInputError(f"{path}: not a readable pull manifest: {err}") from err
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        raise BadInputError(f"{path}: not a pull manifest (format {MANIFEST_FORMAT!r} expected)")
    return data


def _check_spec(path: Path, engine: dict[str, Any], spec: RuntimeSpec | None) -> None:
    if spec is None:
        return
    asked = (spec.backend, spec.precision)
    pulled = (engine["backend"], engine["precision"])
    if asked != pulled:
        raise BadInputError(
            f"{path}: the pulled engine {engine['id']} is {' '.join(pulled)}, the spec asks for {' '.join(asked)}; "
            "pull with --precision, or pass spec=None to serve what was pulled"
        )


def _signed_request(path: Path, data: dict[str, Any], spec: RuntimeSpec | None) -> dict[str, Any]:
    """What loading this manifest asks of the engine's signed statement (core.signing): the model
    the manifest's name says (`manifests/<model>.json`) and its digest, and the spec's backend and
    precision where a spec is given."""
    asked: dict[str, Any] = {"model.name": path.stem, "model.digest": data["model"].get("digest")}
    if spec is not None:
        asked.update({"backend": spec.backend, "precision": spec.precision})
    return asked


# A serving process's load event is best effort: a catalog that does not answer in this long is given
# up on (the catalog's own default waits 10 s, which a process's close() and exit would wait too).
EVENT_CONNECT_SECONDS = 2


def _short_connect(url: str) -> str:
    """`url` with a short connect timeout where it is a PostgreSQL URL that names none itself."""
    import sqlalchemy as sa

    parsed = sa.engine.make_url(url)
    if not parsed.drivername.startswith("postgresql") or "connect_timeout" in parsed.query:
        return url
    return parsed.update_query_dict({"connect_timeout": str(EVENT_CONNECT_SECONDS)}).render_as_string(
        hide_password=False
    )


def _record(
    url: str | None,
    model: dict[str, Any],
    facts: EngineFacts,
    outcome: str,
    reason: str,
    timer: PhaseTimer,
    started: float,
) -> None:
    """The load event, where a catalog is given (`url`); an unreachable catalog is logged, not raised."""
    if not url:
        return
    from enginecache.core.fingerprint import host_fingerprint
    from enginecache.db.models import LoadEventRecord
    from enginecache.errors import UnavailableError
    from enginecache.service.context import AppContext
    from enginecache.service.engines.events import record_event

    event = LoadEventRecord(
        hostname=host_fingerprint(probe_gpus=False).hostname,
        model_name=str(model.get("name") or ""),
        model_id=model.get("id"),
        engine_id=facts.id,
        backend=facts.backend,
        precision=facts.precision,
        host_target="",
        outcome=outcome,
        source="load_or_build",
        reason=reason,
        read_verify_s=timer.phases.get("read_verify"),
        total_s=time.perf_counter() - started,
        phases={**timer.phases, "pulled": 1.0},
    )
    try:
        app = AppContext.from_settings(facts.home, _short_connect(url))
        try:
            record_event(app, event)
        finally:
            app.close()
    except UnavailableError as err:  # served from the pulled folder all the same
        logger.warning("load event not recorded (catalog unreachable): %s", err)


def _runtime_cache(home: Path, data: dict[str, Any]) -> str | None:
    """TensorRT-RTX: the runtime cache the pull brought, where it fits this host (its module is
    imported only where the manifest names one)."""
    if not data.get("runtime_cache"):
        return None
    from enginecache.service.serving.runtimecache import for_pulled

    return for_pulled(home, data)


def load_pulled(
    manifest: Path, spec: RuntimeSpec | None, *, db_url: str | None = None, started: float | None = None
) -> LoadedEngine:
    """The engine a pull manifest names, verified and loaded (module docstring)."""
    started = time.perf_counter() if started is None else started
    url = db_url or os.environ.get("ENGINECACHE_DB_URL")
    data = read_manifest(manifest)
    engine = data["engine"]
    _check_spec(manifest, engine, spec)
    if data.get("bundle"):  # an engine bundle: its verified folder, for a runtime that loads folders
        from enginecache.service.serving.bundleload import load_pulled_bundle

        return load_pulled_bundle(manifest, data)
    home = manifest.parent.parent
    row = {**engine, "targets": ",".join(engine["targets"]), "onnx_digest": data["model"].get("digest")}
    facts = EngineFacts.from_row(home, row)
    timer = PhaseTimer()
    hold = BlobHold()  # while the engine lives, `pull --max-bytes` into this folder leaves its blob alone
    try:
        # a corrupt or tampered copy is the folder's own: the next pull replaces it, the catalog's engine
        # stays as it is
        session = load_engine(
            facts,
            timer,
            on_corrupt=lambda _reason: None,
            hold=hold,
            request=_signed_request(manifest, data, spec),
            runtime_cache=_runtime_cache(home, data),
        )
    except EngineRejectedError as err:
        _record(url, data["model"], facts, "rejected", str(err), timer, started)
        raise
    # The serving start does not wait on the catalog: an unreachable one (a cut link) would hold it
    # for the connect timeout. The event is written beside it; close() (or the exit) waits for that,
    # which a catalog that does not answer ends within EVENT_CONNECT_SECONDS.
    record = None
    if url:
        record = threading.Thread(
            target=_record,
            args=(url, data["model"], facts, "hit", f"engine {facts.id} from {home}", timer, started),
            name="enginecache-load-event",
        )
        record.start()
    loaded = LoadedEngine(
        session,
        lambda: _no_catalog_row(facts.id),
        "hit",
        phases=dict(timer.phases),
        onnx_digest=str(data["model"]["digest"]),
        facts=facts,
        model_name=str(data["model"]["name"]),
        via="pulled",
    )
    loaded._pending = record
    loaded._hold = hold
    return loaded


def _no_catalog_row(engine_id: int) -> Any:
    raise BadInputError(
        f"engine {engine_id} was loaded from a pulled folder: there is no catalog row here (use `facts`, `engine_id`)"
    )
