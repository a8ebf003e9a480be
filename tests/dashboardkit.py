"""Helpers for the dashboard's AppTest suites: a seeded catalog built once per test module and
copied for each test, the view scripts, and readers for what a view rendered.

Seeding builds a real engine, so it runs once per module (`seed_catalog`); each test gets a
private copy of that home (`copy_catalog`: a file copy, milliseconds), so tests that submit,
verify, corrupt or retire never see each other's writes and never share a query cache key.
"""

from __future__ import annotations

import contextlib
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from sqlmodel import Session, select
from streamlit.testing.v1 import AppTest

from enginecache.core.fingerprint import host_fingerprint
from enginecache.db import queue
from enginecache.db.models import EngineRecord, EngineStatus, JobRecord, JobStatus, utcnow
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from enginecache.service.jobs.routing import worker_capabilities
from enginecache.service.models.register import register_model
from enginecache.service.readmodels import liveness
from tests.modelfactory import make_conv

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 60  # seconds per AppTest run: generous, the machine is shared
# The seeded worker registered once per module stays "online" for the module's whole run: the
# liveness window is widened instead of racing a 15 s heartbeat against a loaded machine.
LIVENESS_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class SeedIds:
    """What `seed_catalog` made, by id (the same in every copy)."""

    home: Path
    model_id: int
    engine_id: int
    failed_job_id: int
    model_file: Path


@dataclass
class Seeded:
    app: AppContext
    model_id: int
    engine_id: int
    failed_job_id: int
    model_file: Path


def seed_catalog(home: Path, models_dir: Path) -> SeedIds:
    """One model with a READY rtx fp32 engine for sm86, a registered worker, and a failed job."""
    app = AppContext.from_settings(home)
    try:
        model_file = make_conv(models_dir / "convnet.onnx")
        model = register_model(app, model_file).model
        request = BuildRequest(model="convnet", backend="rtx", targets=("sm86",), precision="fp32")
        built = build_engine(app, request).engine
        host = host_fingerprint()
        queue.register_worker(
            app.catalog,
            name="worker-a",
            hostname="gpu-box-1",
            pid=1234,
            fingerprint=host.to_dict(),
            capabilities=worker_capabilities(host),
        )
        with app.catalog.write() as session:
            failed = JobRecord(
                kind="build",
                status=JobStatus.FAILED,
                payload={"model": str(model.id), "backend": "rtx", "precision": "int8", "targets": ["sm89"]},
                requirements={"backend": "rtx"},
                error="calibration data does not match input 'input': expected float32",
                finished_at=utcnow(),
            )
            session.add(failed)
        return SeedIds(home, model.id or 0, built.id or 0, failed.id or 0, model_file)
    finally:
        app.close()  # SQLite checkpoints its WAL: the home is one consistent set of files


def rtx_engine(model_id: int, cache_key: str, **fields: Any) -> EngineRecord:
    """An engine row of `model_id`: rtx, fp16, sm89, built on Linux, READY; `fields` override any column."""
    defaults: dict[str, Any] = {
        "backend": "rtx",
        "backend_version": "1",
        "precision": "fp16",
        "targets": "sm89",
        "status": EngineStatus.READY,
        "onnx_digest": "d",
        "os": "Linux",
    }
    return EngineRecord(model_id=model_id, cache_key=cache_key, **{**defaults, **fields})


def add_failed_build(
    session: Session, model_id: int, error: str, cache_key: str, **job_fields: Any
) -> tuple[JobRecord, EngineRecord]:
    """A FAILED rtx fp16 sm89 build job of `model_id` and the FAILED engine row it left, both with
    `error`, added to `session` (the job flushed: it has its id)."""
    job = JobRecord(
        kind="build",
        status=JobStatus.FAILED,
        payload={"model": str(model_id), "backend": "rtx", "precision": "fp16", "targets": ["sm89"]},
        error=error,
        finished_at=utcnow(),
        **job_fields,
    )
    session.add(job)
    session.flush()
    engine = rtx_engine(
        model_id, cache_key, status=EngineStatus.FAILED, error=error, job_id=job.id, finished_at=utcnow()
    )
    session.add(engine)
    return job, engine


def queued_jobs(app: AppContext) -> list[JobRecord]:
    """The QUEUED jobs of the catalog."""
    with app.catalog.read() as session:
        return list(session.exec(select(JobRecord).where(JobRecord.status == JobStatus.QUEUED)).all())


def copy_catalog(seed: SeedIds, home: Path, monkeypatch: pytest.MonkeyPatch) -> Seeded:
    """A private copy of the seeded home, served to the views (ENGINECACHE_HOME points at it)."""
    shutil.copytree(seed.home, home)
    serve_home(home, monkeypatch)
    return Seeded(AppContext.from_settings(home), seed.model_id, seed.engine_id, seed.failed_job_id, seed.model_file)


def serve_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Point the dashboard at `home`'s SQLite catalog; workers seeded there count as online."""
    monkeypatch.setenv(HOME_ENV, str(home))
    monkeypatch.delenv(DB_URL_ENV, raising=False)
    monkeypatch.setattr(liveness, "WORKER_ALIVE_SECONDS", LIVENESS_SECONDS)


@contextlib.contextmanager
def served_catalog(home: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppContext]:
    """An empty catalog at `home`, served to the views (`serve_home`); closed on exit."""
    serve_home(home, monkeypatch)
    ctx = AppContext.from_settings(home)
    try:
        yield ctx
    finally:
        ctx.close()


def view(name: str) -> AppTest:
    return AppTest.from_string(
        f"from enginecache.dashboard.views import {name}\n{name}.render()\n", default_timeout=TIMEOUT
    )


def engine_view(engine_id: int) -> AppTest:
    """The Engines view opened on one engine (`?engine=ID`)."""
    script = (
        "import streamlit as st\nfrom enginecache.dashboard.views import engines\n"
        f"st.query_params['engine'] = '{engine_id}'\nengines.render()\n"
    )
    return AppTest.from_string(script, default_timeout=TIMEOUT)


def router() -> AppTest:
    return AppTest.from_file(str(ROOT / "enginecache" / "dashboard" / "app.py"), default_timeout=TIMEOUT)


def frame(at: AppTest, *columns: str) -> pd.DataFrame:
    """The first dataframe (or data editor) shown with all these columns (AppTest gives tables no key)."""
    for element in [*at.dataframe, *at.get("arrow_data_frame")]:
        value = element.value
        if all(c in value.columns for c in columns):
            return value
    raise AssertionError(f"no table with columns {columns}")


def plain(text: object) -> str:
    """What an element shows: the views escape user strings for Markdown (`markdown_literal`)."""
    return re.sub(r"\\(.)", r"\1", str(text))


def texts(at: AppTest) -> str:
    parts = [e.value for e in at.markdown] + [e.value for e in at.caption] + [e.value for e in at.subheader]
    parts += [e.value for e in at.title] + [str(e.value) for e in at.success] + [str(e.value) for e in at.info]
    return "\n".join(str(p) for p in parts)
