"""service.readmodels (the dashboard's SQL aggregates, one module per view) on SQLite and PostgreSQL,
what a worker can build and load as its backends describe it, and `enginecache serve`'s process
plumbing."""

from __future__ import annotations

import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from enginecache.core.backends.registry import get_backend
from enginecache.core.fingerprint import host_fingerprint
from enginecache.db import queue
from enginecache.db.models import EngineStatus, JobRecord, JobStatus, utcnow
from enginecache.errors import NotFoundError
from enginecache.service.access.serve import ServeSpec, child_env, dashboard_command, worker_command
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext
from enginecache.service.engines import records as engines
from enginecache.service.jobs.routing import worker_capabilities
from enginecache.service.models.register import register_model
from enginecache.service.readmodels.engines import EngineFilter, engine_filter_options, engine_page
from enginecache.service.readmodels.hosts import HostRow
from enginecache.service.readmodels.models import model_lineage, model_rows
from enginecache.service.readmodels.overview import cache_activity, catalog_counts, recent_failures
from enginecache.service.readmodels.timings import build_time_groups
from tests.modelfactory import make_mlp

ROOT = Path(__file__).resolve().parents[1]


def test_read_models_aggregate_in_sql_on_each_catalog(catalog_ctx: AppContext, tmp_path: Path) -> None:
    app = catalog_ctx
    model = register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp").model
    built = build_engine(app, BuildRequest(model="mlp", backend="rtx", targets=("sm89",), precision="fp32")).engine
    host = host_fingerprint()
    queue.register_worker(
        app.catalog, name="w1", hostname="h1", pid=1, fingerprint=host.to_dict(), capabilities=worker_capabilities(host)
    )
    with app.catalog.write() as session:
        session.add(
            JobRecord(
                kind="build",
                status=JobStatus.DEAD,
                payload={"model": str(model.id), "backend": "rtx", "precision": "fp16", "targets": ["sm80"]},
                error="attempt 3 of 3 failed: child killed by SIGKILL",
                finished_at=utcnow(),
            )
        )
        # a build job answered by the engine another job built: a hit
        session.add(
            JobRecord(kind="build", status=JobStatus.SUCCEEDED, result_engine_id=built.id, finished_at=utcnow())
        )

    counts = catalog_counts(app)
    assert (counts.models, counts.source_models, counts.engines, counts.jobs) == (1, 1, 1, 2)
    assert counts.engines_by_status == {"READY": 1}
    assert counts.jobs_by_status == {"DEAD": 1, "SUCCEEDED": 1}
    assert counts.workers_online == 1

    days = cache_activity(app, days=7)
    assert [(d.misses, d.hits) for d in days] == [(1, 1)]
    assert days[0].day == utcnow().date().isoformat()

    failures = recent_failures(app)
    assert [(f.source, f.status) for f in failures] == [("job", "DEAD")]
    assert "SIGKILL" in failures[0].reason and "fp16 sm80" in failures[0].what

    options = engine_filter_options(app)
    assert options.targets == ["sm89"] and options.precisions == ["fp32"] and options.models == [(model.id, "mlp")]
    assert engine_page(app, EngineFilter(model_id=model.id, target="sm89")).total == 1
    assert engine_page(app, EngineFilter(precision="fp16")).total == 0
    later = EngineFilter(since=utcnow() + timedelta(hours=1))
    assert engine_page(app, later).total == 0

    groups = build_time_groups(app)
    assert [(g.model, g.targets, g.precision, g.engines) for g in groups] == [("mlp", "sm89", "fp32", 1)]
    assert groups[0].mean_seconds == pytest.approx(built.build_seconds)

    rows = model_rows(app)
    assert [(r.name, r.engines) for r in rows] == [("mlp", 1)]
    lineage = model_lineage(app, model.id or 0)
    assert lineage.variants == [] and [(e.precision, e.count) for e in lineage.engines] == [("fp32", 1)]

    verdicts = engines.engine_host_verdicts(app, built.id or 0)
    assert len(verdicts) == 1 and verdicts[0].host == "h1"
    if not host.gpus:
        assert verdicts[0].verdict == "incompatible" and "no NVIDIA GPU" in verdicts[0].reason

    engines.retire_engine(app, built.id or 0)
    assert catalog_counts(app).engines_by_status == {EngineStatus.RETIRED.value: 1}
    with pytest.raises(NotFoundError):
        engines.retire_engine(app, 999)


def test_host_verdict_reads_the_hosts_recorded_gpus_and_versions() -> None:
    from enginecache.db.models import EngineRecord

    engine = EngineRecord(
        id=1,
        model_id=1,
        backend="rtx",
        backend_version="1.7.1",
        precision="fp16",
        targets="sm86,sm89",
        cache_key="k",
        status=EngineStatus.READY,
        onnx_digest="d",
        os="Linux",
    )
    gpu = {"name": "NVIDIA L4", "compute_capability": "sm89"}
    ok = {"packages": {"tensorrt_rtx": "1.7.1"}, "gpus": [gpu]}
    assert engines.host_verdict(engine, ok)[0] == "compatible"
    verdict, reason = engines.host_verdict(
        engine, {**ok, "gpus": [{"name": "NVIDIA H200", "compute_capability": "sm90"}]}
    )
    assert verdict == "incompatible" and "H200 (SM90) is not among" in reason
    verdict, reason = engines.host_verdict(engine, {**ok, "packages": {"tensorrt_rtx": "1.8.0"}})
    assert verdict == "incompatible" and "needs 1.7.1" in reason
    verdict, reason = engines.host_verdict(engine, {"packages": {}, "gpus": [gpu]})
    assert verdict == "incompatible" and "not installed" in reason


def _worker(capabilities: dict[str, object]) -> HostRow:
    now = utcnow()
    return HostRow("w", "h", 1, "online", True, now, now, None, {}, dict(capabilities))


def test_hosts_say_what_each_advertised_backend_can_build_and_load() -> None:
    rtx_targets = ", ".join(get_backend("rtx").known_targets())
    gpu_box = _worker(
        {
            "backends": ["rtx", "trt", "ort"],
            "gpus": [{"name": "NVIDIA L4", "compute_capability": "sm89"}],
            "cpu_target": "x86_64-avx2",
        }
    )
    assert gpu_box.can_build == [f"rtx: any of {rtx_targets} (no GPU needed)", "trt: sm89", "ort: x86_64-avx2"]
    assert gpu_box.can_load == ["rtx: sm89", "trt: sm89", "ort: x86_64-avx2"]
    cpu_box = _worker({"backends": ["rtx", "ort", "tvm"], "gpus": [], "cpu_target": "aarch64-neon"})
    assert cpu_box.can_build == [
        f"rtx: any of {rtx_targets} (no GPU needed)",
        "ort: aarch64-neon",
        "tvm: a backend this version does not know",
    ]
    assert cpu_box.can_load[:2] == ["rtx: nothing (no NVIDIA GPU)", "ort: aarch64-neon"]
    assert _worker({}).can_build == [] and _worker({}).can_load == []


def test_serve_commands_pass_the_catalog_to_both_children(tmp_path: Path) -> None:
    spec = ServeSpec(home=tmp_path, db_url="sqlite:///x.db", port=9123, max_upload_mb=64, worker_name="w")
    command = dashboard_command(spec)
    assert command[1:4] == ["-m", "streamlit", "run"] and command[4].endswith("dashboard/app.py")
    assert Path(command[4]).is_file()
    flags = dict(zip(command[5::2], command[6::2], strict=False))
    assert flags["--server.port"] == "9123" and flags["--server.headless"] == "true"
    assert flags["--server.maxUploadSize"] == "64"
    assert worker_command(spec)[-3:] == ["worker", "--name", "w"]
    env = child_env(spec)
    assert env[HOME_ENV] == str(tmp_path) and env[DB_URL_ENV] == "sqlite:///x.db"


@pytest.mark.slow
def test_serve_on_a_busy_port_fails_with_the_reason(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "enginecache.cli", "--home", str(tmp_path), "serve", "--port", str(port)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 2
    assert f"port {port} is not free" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_build_requests_answered_from_cache_count_as_hits(tmp_path: Path) -> None:
    from enginecache.service.builds.submit import submit_build
    from enginecache.service.engines.loadruns import load_event_stats
    from enginecache.service.jobs.worker import Worker, WorkerConfig
    from tests.modelfactory import make_mlp

    app = AppContext.from_settings(tmp_path / "home")
    register_model(app, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    request = BuildRequest(model="mlp", backend="rtx", targets=("sm86",))
    assert submit_build(app, request).job is not None
    Worker(app, WorkerConfig(name="w", once=True)).run()
    assert cache_activity(app)[-1].hits == 0
    for _ in range(2):
        assert submit_build(app, request).cache_hit is True
    [today] = cache_activity(app)
    assert (today.misses, today.hits) == (1, 2)
    assert load_event_stats(app) == [], "build requests are not serving processes' lookups"
    app.close()


def test_model_rows_count_engines_from_indexes_alone(tmp_path: Path) -> None:
    """The Models view's counts read no engine row (migration 0014): 0.43 s at 100,000 engines on
    SQLite without the indexes, 8 ms with them (bench/bench_dashboard.py)."""
    from enginecache.service.readmodels.models import model_rows_query

    app = AppContext.from_settings(tmp_path / "home")
    try:
        engine = app.catalog.engine
        sql = str(model_rows_query(None, 500).compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        with engine.connect() as conn:
            steps = [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]
    finally:
        app.close()
    on_engines = [step for step in steps if " engines" in step]
    assert len(on_engines) == 2, steps
    assert any("COVERING INDEX ix_engines_model_variant" in step for step in on_engines), steps
    assert any("COVERING INDEX ix_engines_variant" in step for step in on_engines), steps
