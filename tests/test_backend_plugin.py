"""Adding a backend is one package plus one line: `tests/backend_plugin` (a package outside
enginecache) registered by `register_backend`, and nothing else changed, is listed, fingerprinted,
offered by a worker, routed, built and served like the backends enginecache ships."""

from __future__ import annotations

from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from enginecache.core.backends import registry
from enginecache.core.fingerprint import host_fingerprint
from enginecache.db.models import EngineStatus
from enginecache.errors import TargetError
from enginecache.service.context import AppContext
from enginecache.service.jobs.routing import build_requirements, can_run, load_requirements, worker_capabilities
from enginecache.service.serving import localhost
from enginecache.service.serving.runtime import RuntimeSpec, load_or_build
from tests.backend_plugin.backend import TOY_BACKEND
from tests.servingkit import serve_mlp

NUMPY = metadata.version("numpy")
TOY = RuntimeSpec(backend="toy")


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The toy backend registered for this test: its one line, given at run time."""
    monkeypatch.setattr(registry, "_DECLARED", dict(registry._DECLARED))
    monkeypatch.setattr(registry, "_LOADED", dict(registry._LOADED))
    monkeypatch.setattr(localhost, "_TAKEN", {})  # this process's fingerprint, taken again with the toy's library
    registry.register_backend("toy", "tests.backend_plugin:TOY")
    yield


@pytest.mark.usefixtures("toy")
def test_the_registry_lists_a_registered_backend_after_its_own() -> None:
    assert registry.get_backend("toy") is TOY_BACKEND
    assert [b.name for b in registry.all_backends()] == ["rtx", "trt", "ort", "toy"]
    assert registry.backend_label("toy") == "Toy" and registry.BACKENDS["toy"] is TOY_BACKEND
    with pytest.raises(TargetError, match="registered already"):
        registry.register_backend("toy", "tests.backend_plugin:TOY")


def test_an_unregistered_backend_is_unknown() -> None:
    with pytest.raises(TargetError, match="unknown backend 'toy'"):
        registry.get_backend("toy")
    assert "numpy" not in host_fingerprint(probe_gpus=False).packages


@pytest.mark.usefixtures("toy")
def test_the_fingerprint_and_a_workers_capabilities_name_its_library() -> None:
    host = host_fingerprint(probe_gpus=False)
    assert host.packages["numpy"] == NUMPY
    capabilities = worker_capabilities(host)
    assert "toy" in capabilities["backends"] and capabilities["versions"]["toy"] == NUMPY
    needs = build_requirements("toy", TOY_BACKEND.target_info((host.cpu_target,), host), NUMPY, host.os)
    assert needs["backend"] == "toy" and can_run(needs, capabilities)
    assert not can_run({**needs, "backend_version": "0.0.1"}, capabilities)
    without = {**capabilities, "backends": [b for b in capabilities["backends"] if b != "toy"]}
    assert not can_run(needs, without)


@pytest.mark.usefixtures("toy")
def test_it_builds_routes_and_serves_like_the_others(app_ctx: AppContext, tmp_path: Path) -> None:
    served = serve_mlp(app_ctx, tmp_path / "src", TOY)
    engine = served.engine
    assert (engine.backend, engine.backend_version, engine.status) == ("toy", NUMPY, EngineStatus.READY)
    host = host_fingerprint(probe_gpus=False)
    assert can_run(load_requirements(engine), worker_capabilities(host))
    loaded = load_or_build(served.onnx_path, spec=TOY, app=app_ctx, on_miss="fail")
    try:
        assert (loaded.via, loaded.outcome, loaded.engine_id) == ("hitpath", "hit", engine.id)
    finally:
        loaded.close()
