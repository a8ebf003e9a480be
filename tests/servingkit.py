"""Helpers for the serving tests: a model with its ORT engine served once (stat cache and memo
written), aged files, the load events, and running code in a new Python process (what it
printed, or which modules it imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import col, select

from enginecache.db.models import EngineRecord, LoadEventRecord
from enginecache.errors import EngineRejectedError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.models.register import register_model
from enginecache.service.serving import loadpath, memo
from enginecache.service.serving.runtime import RuntimeSpec, load_or_build
from enginecache.service.serving.runtimetypes import LoadedEngine
from tests.modelfactory import make_mlp

ROOT = Path(__file__).resolve().parents[1]
ORT = RuntimeSpec(backend="ort")


def age(*paths: Path) -> None:
    """Set mtimes a minute back: a file hashed right after it was written is racy (re-hashed)."""
    past = time.time() - 60
    for path in paths:
        os.utime(path, (past, past))


def events(app: AppContext) -> list[LoadEventRecord]:
    """The serving lookups recorded, oldest first."""
    query = select(LoadEventRecord).where(LoadEventRecord.source == "load_or_build").order_by(col(LoadEventRecord.id))
    with app.catalog.read() as session:
        return list(session.exec(query).all())


@dataclass(frozen=True)
class Served:
    app: AppContext
    onnx_path: Path
    engine: EngineRecord

    @property
    def blob(self) -> Path:
        return self.app.home / (self.engine.blob_path or "")


def serve_mlp(app: AppContext, folder: Path, spec: RuntimeSpec = ORT, *, name: str = "mlp") -> Served:
    """Register an aged MLP, build its engine for `spec`, and load it once through the full path (which
    writes the stat cache entry and the memo the hit path reads)."""
    onnx_path = make_mlp(folder / f"{name}.onnx")
    age(onnx_path)
    register_model(app, onnx_path, name=name)
    engine = build_engine(app, BuildRequest(model=name, backend=spec.backend, targets=spec.targets)).engine
    # The memo is keyed by the code's identity (every source file's mtime), which this process keeps
    # from its first lookup: an edit of the checkout since then would key this memo by the old code,
    # and a new process (keyed by the code as it is now) would miss it.
    memo.code_identity.cache_clear()
    try:
        first = load_or_build(onnx_path, spec=spec, app=app, on_miss="fail")
    except EngineRejectedError:  # an engine this host cannot load still leaves its memo
        pass
    else:
        assert first.via == "fullpath"
        first.close()
    return Served(app, onnx_path, engine)


def refuse(why: str) -> Any:
    """A stand-in that fails the test with `why` if it is ever called."""

    def refused(*_args: object, **_kwargs: object) -> None:
        raise AssertionError(why)

    return refused


LOAD_PATHS = ["hit", "full"]


def load_through(served: Served, spec: RuntimeSpec, path: str, monkeypatch: Any) -> LoadedEngine:
    """One lookup of `served` through `path`: "hit" (the hit path, with the full path refused) or
    "full" (the full path alone)."""
    if path == "hit":
        with monkeypatch.context() as patch:
            patch.setattr(loadpath, "load_or_build_full", refuse("load_or_build took the full path"))
            return load_or_build(served.onnx_path, spec=spec, app=served.app, on_miss="fail")
    return loadpath.load_or_build_full(served.onnx_path, spec=spec, app=served.app, on_miss="fail")


def run_python(
    code: str, *, env: dict[str, str] | None = None, timeout: float = 120, python: str = sys.executable
) -> Any:
    """Run `code` in a new interpreter (`python`) from the checkout; it prints one JSON line last,
    returned decoded."""
    done = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def loaded_modules(code: str, *names: str) -> list[str]:
    """The modules among `names` (each one or any of its submodules) that a new interpreter has
    imported once it has run `code`, sorted."""
    probe = (
        f"{code}\nimport json, sys\nnames = {names!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if any(m == n or m.startswith(n + '.') for n in names))))\n"
    )
    return list(run_python(probe))
