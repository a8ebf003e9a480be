"""A crash after each step of a blob write and of `model add` leaves the old state or the new one,
never a half: a new process is killed (os._exit, no clean-up runs) just before its k-th durable step
(a file or directory fsync, a link, rename or replace, the catalog commit) and just after the
commit, for every k the clean run takes; the next process sees either nothing or a whole verified
blob or model, can add the model again, and gc lists what the crash left for removal."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest

from enginecache.core.hashing import sha256_file
from enginecache.core.onnx_info import model_digest
from enginecache.db.models import ModelRecord, utcnow
from enginecache.service.context import AppContext
from enginecache.service.maintenance.gc.collect import collect_garbage
from enginecache.service.models.register import find_model_by_digest, register_model
from tests.modelfactory import make_external_data_model

ROOT = Path(__file__).resolve().parents[1]
CRASHED = 77

# Counts the durable steps of what runs after it, and dies just before step K (K = 0: never, then
# prints how many steps there were). The catalog commit counts twice: before it and after it.
CRASHER = """
import json, os, sys
from pathlib import Path
sys.path.insert(0, {root!r})
K = int(sys.argv[1])
steps = [0]

def step(name):
    steps[0] += 1
    if steps[0] == K:
        os._exit({crashed})

def counted(name, real):
    def call(*args, **kwargs):
        step(name)
        return real(*args, **kwargs)
    return call

from enginecache.service.context import AppContext
app = AppContext.from_settings(Path({home!r}))
app.catalog  # opened and migrated before counting: the steps are the operation's own
for name in ("fsync", "link", "rename", "replace"):
    setattr(os, name, counted(name, getattr(os, name)))
from sqlalchemy.orm import SessionTransaction
real_commit = SessionTransaction.commit
def commit(self, *args, **kwargs):
    step("commit")
    done = real_commit(self, *args, **kwargs)
    step("committed")
    return done
SessionTransaction.commit = commit
{body}
print(json.dumps({{"steps": steps[0]}}))
"""

MODEL_ADD = """
from enginecache.service.models.register import register_model
register_model(app, Path({model!r}), name="m")
"""

BLOB_WRITE = """
app.store.write_blob(memoryview(Path({blob!r}).read_bytes()))
"""


def _run(home: Path, body: str, k: int) -> subprocess.CompletedProcess[str]:
    script = CRASHER.format(root=str(ROOT), home=str(home), crashed=CRASHED, body=body)
    return subprocess.run([sys.executable, "-c", script, str(k)], capture_output=True, text=True, timeout=120)


def _steps(home: Path, body: str) -> int:
    clean = _run(home, body, 0)
    assert clean.returncode == 0, clean.stderr
    return int(json.loads(clean.stdout.strip().splitlines()[-1])["steps"])


def _crash_at_each_step(
    tmp_path: Path, body: str, check: Callable[[int, AppContext], None], *, at_least: int, steps: str
) -> None:
    """Count the durable steps of `body` in a clean run (at least `at_least`: `steps` says which),
    then for each step k crash a new process just before it, in a home of its own, and `check(k, app)`
    the restart there."""
    total = _steps(tmp_path / "clean", body)
    assert total >= at_least, steps
    for k in range(1, total + 1):
        home = tmp_path / f"crash-{k}"
        crashed = _run(home, body, k)
        assert crashed.returncode == CRASHED, (k, crashed.stderr)
        app = AppContext.from_settings(home)  # the restart
        try:
            check(k, app)
        finally:
            app.close()


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return make_external_data_model(tmp_path / "src")  # a bundle of two files


def _digest(model: Path) -> str:
    probe = AppContext.from_settings(model.parent.parent / "probe-home")
    try:
        return register_model(probe, model, name="probe").model.digest
    finally:
        probe.close()


@pytest.mark.slow
def test_a_crash_at_any_step_of_model_add_leaves_nothing_or_the_whole_model(tmp_path: Path, model: Path) -> None:
    digest = _digest(model)

    def check(k: int, app: AppContext) -> None:
        row: ModelRecord | None = find_model_by_digest(app, digest)
        bundle = app.store.model_dir(digest)
        if row is not None:  # the commit happened: the whole bundle is there and verifies
            assert bundle.is_dir(), k
            assert model_digest(bundle / model.name, list(row.info["external_data_files"])) == digest, k
        elif bundle.exists():  # published before the commit: whole, so re-adding may reuse it
            files = sorted(p.name for p in bundle.iterdir())
            assert files == sorted([model.name, *[p.name for p in model.parent.iterdir() if p != model]]), k
        again = register_model(app, model, name="m")  # the operator runs it again
        assert again.model.digest == digest and app.store.model_dir(digest).is_dir(), k
        debris = collect_garbage(app, clock=lambda: utcnow() + timedelta(days=1))
        live = Path("models") / digest
        assert all(not Path(r.path).is_relative_to(live) for r in debris.removals), "gc keeps the live bundle"

    body = MODEL_ADD.format(model=str(model))
    steps = "the files' fsyncs, the rename, the directory fsyncs, the commit (before and after)"
    _crash_at_each_step(tmp_path, body, check, at_least=7, steps=steps)


@pytest.mark.slow
def test_a_crash_at_any_step_of_a_blob_write_leaves_no_blob_or_the_whole_blob(tmp_path: Path) -> None:
    payload = tmp_path / "payload.bin"
    payload.write_bytes(bytes(range(256)) * 4096)
    digest = sha256_file(payload)

    def check(k: int, app: AppContext) -> None:
        blob = app.store.blob_path(digest)
        if blob.exists():
            assert sha256_file(blob) == digest, f"step {k}: a blob under its name is whole"
        published = app.store.write_blob(memoryview(payload.read_bytes()))  # written again after the restart
        assert published.sha256 == digest and sha256_file(app.store.blob_path(digest)) == digest

    body = BLOB_WRITE.format(blob=str(payload))
    _crash_at_each_step(tmp_path, body, check, at_least=3, steps="the temp file's fsync, the link, the directory fsync")
