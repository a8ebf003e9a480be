"""`model_profiles` (NIM-style profiles): every engine of a model judged for a host by the backend's
one compatibility rule, with the reason, and the one the host would select (exact target first, then
the asked precision or the documented preference order, then the newest); not-READY engines listed,
never selected; RETIRED ones left out."""

from __future__ import annotations

from pathlib import Path

import pytest

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint
from enginecache.db.models import EngineRecord, EngineStatus
from enginecache.errors import NotFoundError
from enginecache.service.builds.plan import BuildRequest, build_engine
from enginecache.service.context import AppContext
from enginecache.service.engines.records import retire_engine
from enginecache.service.fleet.profiles import PRECISION_PREFERENCE, Wanted, model_profiles
from enginecache.service.models.register import register_model
from tests.enginerows import engine_row_like
from tests.modelfactory import make_mlp


def fake_gpu_host(cc: str) -> HostFingerprint:
    """This host's fingerprint with one NVIDIA GPU of `cc` added (no such GPU here: a test-only host)."""
    gpu = {"index": 0, "name": "NVIDIA test GPU", "uuid": "GPU-test", "compute_capability": cc, "memory_total_bytes": 1}
    return HostFingerprint.from_dict({**host_fingerprint().to_dict(), "hostname": f"host-{cc}", "gpus": [gpu]})


@pytest.fixture
def mlp_engines(app_ctx: AppContext, tmp_path: Path) -> dict[str, EngineRecord]:
    register_model(app_ctx, make_mlp(tmp_path / "mlp.onnx"), name="mlp")
    return {
        p: build_engine(app_ctx, BuildRequest(model="mlp", backend="ort", precision=p)).engine for p in ("fp32", "fp16")
    }


def test_ort_engines_on_this_host_are_compatible_and_the_preferred_precision_is_selected(
    app_ctx: AppContext, mlp_engines: dict[str, EngineRecord]
) -> None:
    assert PRECISION_PREFERENCE.index("fp16") < PRECISION_PREFERENCE.index("fp32")
    found = model_profiles(app_ctx, "mlp")
    assert [p.engine_id for p in found.profiles] == sorted((e.id or 0 for e in mlp_engines.values()), reverse=True)
    assert all(p.verdict == "compatible" for p in found.profiles), [p.reason for p in found.profiles]
    assert found.selected is not None and found.selected.engine_id == mlp_engines["fp16"].id
    asked = model_profiles(app_ctx, "mlp", wanted=Wanted(precision="fp32")).selected
    assert asked is not None and asked.engine_id == mlp_engines["fp32"].id
    assert model_profiles(app_ctx, "mlp", wanted=Wanted(precision="int8")).selected is None
    data = found.to_dict()
    assert data["selected_engine_id"] == mlp_engines["fp16"].id and data["model"] == "mlp"
    assert sum(p["selected"] for p in data["profiles"]) == 1


def test_an_ort_engine_for_another_cpu_or_library_is_incompatible_with_the_reason(
    app_ctx: AppContext, mlp_engines: dict[str, EngineRecord]
) -> None:
    fp16 = mlp_engines["fp16"]
    other_cpu = engine_row_like(app_ctx, fp16, targets="riscv64-rv64gc")
    old_lib = engine_row_like(app_ctx, fp16, backend_version="1.0.0")
    failed = engine_row_like(app_ctx, fp16, status=EngineStatus.FAILED, sha256=None)
    retire_engine(app_ctx, mlp_engines["fp32"].id or 0)
    found = {p.engine_id: p for p in model_profiles(app_ctx, "mlp").profiles}
    assert mlp_engines["fp32"].id not in found, "RETIRED engines are not profiles"
    assert (
        found[other_cpu.id or 0].verdict == "incompatible" and "this host's CPU is" in found[other_cpu.id or 0].reason
    )
    assert found[old_lib.id or 0].verdict == "incompatible" and "1.0.0" in found[old_lib.id or 0].reason
    assert failed.id not in found, "a FAILED engine is no profile: it has no engine to load"
    assert [p.engine_id for p in found.values() if p.selected] == [fp16.id]


def test_rtx_engines_exact_target_first_then_precision_fake_gpu_host(
    app_ctx: AppContext, mlp_engines: dict[str, EngineRecord]
) -> None:
    import tensorrt_rtx

    base = mlp_engines["fp16"]
    rtx = {"backend": "rtx", "backend_version": tensorrt_rtx.__version__}
    wide = engine_row_like(app_ctx, base, **rtx, targets="sm80,sm86", precision="fp16")
    exact_fp32 = engine_row_like(app_ctx, base, **rtx, targets="sm86", precision="fp32")
    exact_fp16 = engine_row_like(app_ctx, base, **rtx, targets="sm86", precision="fp16")
    other_gpu = engine_row_like(app_ctx, base, **rtx, targets="sm89", precision="fp16")
    found = model_profiles(app_ctx, "mlp", host=fake_gpu_host("sm86"))
    verdicts = {p.engine_id: p for p in found.profiles}
    assert verdicts[wide.id or 0].verdict == verdicts[exact_fp32.id or 0].verdict == "compatible"
    assert (
        verdicts[other_gpu.id or 0].verdict == "incompatible" and "SM86" in verdicts[other_gpu.id or 0].reason.upper()
    )
    assert found.selected is not None and found.selected.engine_id == exact_fp16.id, "GPU, exact target, then fp16"
    assert verdicts[base.id or 0].verdict == "compatible" and not verdicts[base.id or 0].on_gpu, "the CPU engine too"
    asked = model_profiles(app_ctx, "mlp", wanted=Wanted(precision="fp32"), host=fake_gpu_host("sm86")).selected
    assert asked is not None and asked.engine_id == exact_fp32.id
    on_sm80 = model_profiles(app_ctx, "mlp", host=fake_gpu_host("sm80")).selected
    assert on_sm80 is not None and on_sm80.engine_id == wide.id, "the only GPU engine whose targets include SM80"


def test_an_unknown_model_is_not_found(app_ctx: AppContext) -> None:
    with pytest.raises(NotFoundError):
        model_profiles(app_ctx, "nope")


def test_a_gpu_host_never_gets_a_cpu_engine_unless_allowed_fake_gpu_host(
    app_ctx: AppContext, mlp_engines: dict[str, EngineRecord]
) -> None:
    """An SM90 host with no engine for its GPU: pull took the ONNX Runtime engine and exited 0. Nothing
    is selected now, and pull says what the host lacks; --allow-cpu takes the CPU engine."""
    from enginecache.errors import NoEngineFitsError
    from enginecache.service.fleet.pull import pull

    host = fake_gpu_host("sm90")
    found = model_profiles(app_ctx, "mlp", host=host)
    assert found.selected is None and any(p.verdict == "compatible" and not p.on_gpu for p in found.profiles)
    with pytest.raises(NoEngineFitsError, match=r"this host's GPU \(sm90\) has no engine.*--allow-cpu"):
        pull(app_ctx, "mlp", app_ctx.home.parent / "pulled", host=host)
    allowed = model_profiles(app_ctx, "mlp", wanted=Wanted(allow_cpu=True), host=host).selected
    assert allowed is not None and (allowed.backend, allowed.on_gpu) == ("ort", False)


def test_pull_takes_what_the_server_loads_backend_precision_or_one_engine(
    app_ctx: AppContext, mlp_engines: dict[str, EngineRecord]
) -> None:
    """The serving example's server loads one backend and precision; pull preferred fp16 of any
    backend, and the server crash-looped on what it was given."""
    import tensorrt_rtx

    rtx = {"backend": "rtx", "backend_version": tensorrt_rtx.__version__}
    gpu_fp16 = engine_row_like(app_ctx, mlp_engines["fp16"], **rtx, targets="sm86", precision="fp16")
    host = fake_gpu_host("sm86")
    assert model_profiles(app_ctx, "mlp", host=host).selected.engine_id == gpu_fp16.id  # type: ignore[union-attr]
    served = Wanted(backend="ort", precision="fp32", allow_cpu=True)
    chosen = model_profiles(app_ctx, "mlp", wanted=served, host=host).selected
    assert chosen is not None and (chosen.backend, chosen.precision) == ("ort", "fp32")
    pinned = model_profiles(app_ctx, "mlp", wanted=Wanted(engine_id=gpu_fp16.id), host=host).selected
    assert pinned is not None and pinned.engine_id == gpu_fp16.id
    assert model_profiles(app_ctx, "mlp", wanted=Wanted(backend="rtx", precision="fp32"), host=host).selected is None
