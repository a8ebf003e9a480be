"""A serving start from a pulled folder with no catalog: `load_or_build(DIR/manifests/MODEL.json)` in a
new process verifies the pulled engine against its manifest and loads it, the readiness probe answers
for it, a damaged copy is refused CORRUPT and the next pull repairs it, a spec that disagrees with what
was pulled is refused, and a reachable catalog gets the load event (an unreachable one does not stop
the start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from enginecache.core.blobpaths import blob_path
from enginecache.errors import BadInputError, EngineRejectedError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.fleet.pull import manifest_path, pull
from enginecache.service.models.register import register_model
from enginecache.service.serving.runtime import RuntimeSpec, load_or_build
from tests.conftest import corrupt_blob
from tests.modelfactory import make_mlp
from tests.nocatalog import NOBODY
from tests.servingkit import ROOT, events


@pytest.fixture
def pulled(app_ctx: AppContext, tmp_path: Path) -> Path:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    build_engine(app_ctx, BuildRequest(model="mlp", backend="ort", precision="fp16"))
    dest = tmp_path / "engines"
    pull(app_ctx, "mlp", dest)
    return manifest_path(dest, "mlp")


def test_a_new_process_starts_from_the_pulled_folder_with_no_catalog(
    app_ctx: AppContext, pulled: Path, tmp_path: Path
) -> None:
    (app_ctx.home / "catalog.db").unlink()  # no catalog at all, let alone a connection
    state = tmp_path / "state.json"
    code = f"""
import json, numpy as np
from enginecache import load_or_build
engine = load_or_build({str(pulled)!r}, spec=None, state_file={str(state)!r})
out = engine.infer({{"input": np.ones((1, 16), dtype=np.float32)}})
print(json.dumps({{"via": engine.via, "id": engine.engine_id, "shape": list(next(iter(out.values())).shape)}}))
import subprocess, sys
probe = [sys.executable, "-m", "enginecache.cli", "ready", "--state", {str(state)!r}]
ready = subprocess.run(probe, capture_output=True)
print(json.dumps({{"via": engine.via, "id": engine.engine_id, "ready": ready.returncode}}))
"""
    env = {k: v for k, v in os.environ.items() if k not in ("ENGINECACHE_DB_URL", "ENGINECACHE_HOME")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    first, last = (json.loads(line) for line in done.stdout.strip().splitlines()[-2:])
    manifest = json.loads(pulled.read_text())
    assert first["via"] == "pulled" and first["id"] == manifest["engine"]["id"] and first["shape"][0] == 1
    assert last["ready"] == 0, "the readiness probe answers for the process holding the pulled engine"
    assert not (app_ctx.home / "catalog.db").exists(), "nothing created a catalog"


def test_a_damaged_pulled_copy_is_corrupt_and_the_next_pull_repairs_it(app_ctx: AppContext, pulled: Path) -> None:
    manifest = json.loads(pulled.read_text())
    dest = pulled.parent.parent
    blob = blob_path(dest, manifest["engine"]["sha256"])
    corrupt_blob(blob)
    with pytest.raises(EngineRejectedError) as rejected:
        load_or_build(pulled, spec=None)
    assert rejected.value.verdict == "CORRUPT"
    again = pull(app_ctx, "mlp", dest)
    assert not again.up_to_date and again.copied_bytes == manifest["engine"]["size_bytes"], "copied afresh"
    with load_or_build(pulled, spec=None) as engine:
        assert engine.via == "pulled"


def test_a_spec_that_disagrees_with_what_was_pulled_is_refused(pulled: Path) -> None:
    with pytest.raises(BadInputError, match="ort fp16, the spec asks for rtx fp32"):
        load_or_build(pulled, spec=RuntimeSpec())
    with load_or_build(pulled, spec=RuntimeSpec(backend="ort", precision="fp16")) as engine:
        out = engine.infer({"input": np.ones((2, 16), dtype=np.float32)})
        assert next(iter(out.values())).shape[0] == 2


def test_a_reachable_catalog_gets_the_load_event_and_an_unreachable_one_does_not_stop_the_start(
    app_ctx: AppContext, pulled: Path, caplog: pytest.LogCaptureFixture
) -> None:
    before = len(events(app_ctx))
    with load_or_build(pulled, spec=None, db_url=app_ctx.db_url) as engine:
        assert engine.via == "pulled"
    recorded = events(app_ctx)
    assert len(recorded) == before + 1 and recorded[-1].outcome == "hit"
    assert recorded[-1].engine_id == json.loads(pulled.read_text())["engine"]["id"]
    with load_or_build(pulled, spec=None, db_url=NOBODY) as engine:
        assert engine.via == "pulled"
    assert "event not recorded" in caplog.text and "port 1" in caplog.text


def test_closing_with_a_catalog_that_hangs_does_not_wait_for_it(pulled: Path) -> None:
    """A catalog that accepts the connection and never answers: close() waited for the load event's
    write, 10.7 s (the catalog's connect timeout); the event's own connect is cut short, unrecorded."""
    import socket
    import time

    from enginecache.service.serving.pulled import EVENT_CONNECT_SECONDS

    with socket.socket() as silent:  # listens, never accepts: the client waits for a greeting
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"postgresql+psycopg://enginecache@127.0.0.1:{silent.getsockname()[1]}/catalog"
        engine = load_or_build(pulled, spec=None, db_url=url)
        started = time.monotonic()
        engine.close()
        waited = time.monotonic() - started
    assert EVENT_CONNECT_SECONDS <= 2 and waited < 6, f"close() waited {waited:.1f} s on a catalog that hangs"
