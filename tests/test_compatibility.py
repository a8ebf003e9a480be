"""One compatibility rule per backend: a verdict table pinned per backend, and every caller that
decides "can this host load that engine" (the catalog's per-host column, `check`, test-load routing)
agreeing with it.

The hosts are `HostFingerprint` values built here: no GPU is needed, and the GPU hosts are fakes
(hence `fake_gpu` in the test names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from enginecache.core.backends.base import CompatibilityResult, EngineRef
from enginecache.core.backends.ort.backend import ORT_BACKEND
from enginecache.core.backends.registry import all_backends, get_backend
from enginecache.core.fingerprint import GpuInfo, HostFingerprint, host_fingerprint
from enginecache.core.verdicts import Verdict
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import check_engine, get_engine, host_verdict
from enginecache.service.jobs.refs import engine_ref
from enginecache.service.jobs.routing import can_run, load_requirements
from enginecache.service.models.register import register_model
from tests.modelfactory import make_mlp

L4 = GpuInfo(index=0, name="NVIDIA L4", uuid="GPU-l4", compute_capability="sm89", memory_total_bytes=24 << 30)
H200 = GpuInfo(index=0, name="NVIDIA H200", uuid="GPU-h200", compute_capability="sm90", memory_total_bytes=141 << 30)
VERSIONS = {"tensorrt_rtx": "1.7.1", "tensorrt": "10.13.0.35", "onnxruntime": "1.22.0"}

# The host every engine below is compatible with; each case changes one thing.
HOST = HostFingerprint(
    hostname="node-1",
    os="Linux",
    os_release="6.8",
    machine="x86_64",
    python="3.12.3",
    cpu_model="AMD EPYC",
    cpu_isa=("avx", "avx2", "sse4_2"),
    gpus=(L4,),
    driver_version="580.65",
    cuda_driver_version="13.0",
    nvml="ok",
    packages=dict(VERSIONS),
)

ENGINES = {
    "rtx": EngineRef("rtx", "1.7.1", ("sm86", "sm89"), "fp16", os="Linux"),
    "trt": EngineRef("trt", "10.13.0.35", ("sm89",), "fp16", os="Linux"),
    "ort": EngineRef("ort", "1.22.0", ("x86_64-avx2",), "fp32", os="Linux"),
}


def _host(case: str, backend: str) -> HostFingerprint:
    module = get_backend(backend).module
    if case == "compatible":
        return HOST
    if case == "library version":
        return HOST.replace(packages={**VERSIONS, module: "9.9.9"})
    if case == "hardware not in targets":  # a GPU of another SM; for ORT a CPU of another ISA level
        return HOST.replace(gpus=(H200,), cpu_isa=("avx", "avx2", "avx512f"))
    if case == "os":
        return HOST.replace(os="Windows")
    if case == "no gpu":
        return HOST.replace(gpus=(), nvml="unavailable: no NVIDIA driver", driver_version=None)
    if case == "library absent":
        return HOST.replace(packages={k: v for k, v in VERSIONS.items() if k != module})
    raise AssertionError(case)


# (backend, case, verdict, a fragment of the reason)
TABLE = [
    ("rtx", "compatible", "compatible", "GPU and version match"),
    ("rtx", "library version", "incompatible", "this host has TensorRT-RTX 9.9.9, the engine needs 1.7.1"),
    ("rtx", "hardware not in targets", "incompatible", "NVIDIA H200 (SM90) is not among the engine's targets"),
    ("rtx", "os", "incompatible", "the engine was built for Linux, this host runs Windows"),
    ("rtx", "no gpu", "incompatible", "this host has no NVIDIA GPU (unavailable: no NVIDIA driver)"),
    ("rtx", "library absent", "incompatible", "TensorRT-RTX is not installed on this host"),
    ("trt", "compatible", "compatible", "GPU and version match"),
    ("trt", "library version", "incompatible", "this host has TensorRT 9.9.9, the engine needs 10.13.0.35"),
    ("trt", "hardware not in targets", "incompatible", "NVIDIA H200 (SM90) is not among the engine's targets"),
    ("trt", "os", "incompatible", "the engine was built for Linux, this host runs Windows"),
    ("trt", "no gpu", "incompatible", "this host has no NVIDIA GPU"),
    ("trt", "library absent", "incompatible", "TensorRT is not installed on this host"),
    ("ort", "compatible", "compatible", "CPU and ONNX Runtime version match"),
    ("ort", "library version", "incompatible", "this host has ONNX Runtime 9.9.9, the engine needs 1.22.0"),
    ("ort", "hardware not in targets", "incompatible", "this host's CPU is x86_64-avx512f"),
    ("ort", "os", "incompatible", "the engine was built for Linux, this host runs Windows"),
    ("ort", "no gpu", "compatible", "CPU and ONNX Runtime version match"),  # a CPU engine needs no GPU
    ("ort", "library absent", "incompatible", "ONNX Runtime is not installed on this host"),
]
IDS = [f"{backend}-{case}" for backend, case, _, _ in TABLE]


def _record(ref: EngineRef) -> EngineRecord:
    """The catalog row an engine like `ref` has once READY."""
    return EngineRecord(
        id=7,
        model_id=1,
        backend=ref.backend,
        backend_version=ref.backend_version,
        precision=ref.precision,
        targets=",".join(ref.targets),
        cache_key="k" * 64,
        status=EngineStatus.READY,
        onnx_digest="d" * 64,
        os=ref.os or "",
    )


def _capabilities(host: HostFingerprint) -> dict[str, Any]:
    """What `routing.worker_capabilities` records for a worker on `host` (its libraries found by
    their versions, since the fake host's modules cannot be looked up here)."""
    here = [b for b in all_backends() if host.packages.get(b.module)]
    return {
        "backends": [b.name for b in here],
        "versions": {b.name: host.packages[b.module] for b in here},
        "gpus": [{"name": g.name, "compute_capability": g.compute_capability} for g in host.gpus],
        "cpu_target": host.cpu_target,
        "os": host.os,
    }


@pytest.mark.parametrize(("backend", "case", "verdict", "fragment"), TABLE, ids=IDS)
def test_verdict_table_fake_gpu_hosts(backend: str, case: str, verdict: str, fragment: str) -> None:
    result = get_backend(backend).compatibility(ENGINES[backend], _host(case, backend))
    assert (result.verdict, fragment in result.reason) == (verdict, True), result.reason
    assert result.compatible is (verdict == "compatible")


@pytest.mark.parametrize(("backend", "case", "verdict", "fragment"), TABLE, ids=IDS)
def test_header_check_without_a_local_blob_is_the_rule_fake_gpu_hosts(
    backend: str, case: str, verdict: str, fragment: str
) -> None:
    host = _host(case, backend)
    rule = get_backend(backend).compatibility(ENGINES[backend], host)
    assert get_backend(backend).check_compatibility(ENGINES[backend], host) == rule


@pytest.mark.parametrize(("backend", "case", "verdict", "fragment"), TABLE, ids=IDS)
def test_catalog_host_verdict_is_the_rule_fake_gpu_hosts(backend: str, case: str, verdict: str, fragment: str) -> None:
    """The dashboard's per-host column decides from the worker's recorded fingerprint: same verdict,
    same reason (plus a note that the header is checked on the host itself)."""
    host = _host(case, backend)
    record = _record(ENGINES[backend])
    assert engine_ref(record) == ENGINES[backend]
    rule = get_backend(backend).compatibility(ENGINES[backend], host)
    got, reason = host_verdict(record, host.to_dict())
    assert got == rule.verdict == verdict
    assert reason.startswith(rule.reason) and fragment in reason


@pytest.mark.parametrize(("backend", "case", "verdict", "fragment"), TABLE, ids=IDS)
def test_test_load_routing_agrees_with_the_rule_fake_gpu_hosts(
    backend: str, case: str, verdict: str, fragment: str
) -> None:
    """A test-load job goes to a worker exactly where the rule says that worker can load the engine."""
    host = _host(case, backend)
    needs = load_requirements(_record(ENGINES[backend]))
    assert can_run(needs, _capabilities(host)) is (verdict == "compatible")


def test_a_fingerprint_recorded_by_an_older_worker_fake_gpu_host() -> None:
    """Fields a worker did not record are left empty: an unknown OS is not compared."""
    record = _record(ENGINES["rtx"])
    gpu = {"name": "NVIDIA L4", "compute_capability": "sm89"}
    assert host_verdict(record, {"packages": {"tensorrt_rtx": "1.7.1"}, "gpus": [gpu]})[0] == "compatible"
    verdict, reason = host_verdict(record, {"packages": {"tensorrt_rtx": "1.7.1"}})
    assert verdict == "incompatible" and "no NVIDIA GPU" in reason
    record.status = EngineStatus.FAILED
    assert host_verdict(record, {})[0] == "unknown"


def test_check_and_the_catalog_agree_on_this_host(app_ctx: AppContext, tmp_path: Path) -> None:
    """On the real host: `check` (rule plus the library's header check), the per-host column and
    the rule give one verdict for an ORT engine (compatible) and a TensorRT-RTX one (no GPU here)."""
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    here = host_fingerprint()
    # ort: loadable on the CPU it was optimized on; rtx: only where a GPU of its targets is present.
    expected = {"ort": (True, ""), "rtx": (bool(here.gpus), "" if here.gpus else "no NVIDIA GPU")}
    for name, (compatible, reason) in expected.items():
        request = BuildRequest(model="mlp", backend=name)
        engine = get_engine(app_ctx, build_engine(app_ctx, request).engine.id or 0)
        rule = get_backend(engine.backend).compatibility(engine_ref(engine), here)
        checked = check_engine(app_ctx, engine.id or 0, host=here)
        assert checked.verdict == rule.verdict == host_verdict(engine, here.to_dict())[0], checked.reason
        if name == "ort" or not here.gpus:
            assert rule.compatible is compatible and reason in rule.reason, rule.reason


def test_test_load_routing_asks_the_backends_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """`can_run` of a load is `Backend.compatibility` on the worker (not a second encoding of it): a
    worker the requirement keys alone would take is refused where the rule refuses it, with the
    engine, the worker's OS, GPUs, CPU target and library version the rule was given."""
    host = _host("compatible", "ort")
    needs = load_requirements(_record(ENGINES["ort"]))
    seen: list[tuple[EngineRef, HostFingerprint]] = []

    def refuse(engine: EngineRef, worker: HostFingerprint) -> CompatibilityResult:
        seen.append((engine, worker))
        return CompatibilityResult(Verdict.INCOMPATIBLE, "refused by the rule")

    monkeypatch.setattr(ORT_BACKEND, "compatibility", refuse)
    assert not can_run(needs, _capabilities(host))
    [(engine, worker)] = seen
    assert engine == ENGINES["ort"]
    assert (worker.os, worker.cpu_target, worker.packages) == (host.os, host.cpu_target, {"onnxruntime": "1.22.0"})
