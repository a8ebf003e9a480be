"""What a worker can run, what a job needs, and the words for a job nobody can run yet.

Each backend says what building or loading one of its engines needs (`Backend.build_requirements`,
`Backend.load_requirements`). Whether a worker can load an engine is the backend's compatibility
rule itself (`Backend.compatibility`), decided on the worker's capabilities as a host; whether it
can build one, `can_run`'s match of the build requirements against them. Routing knows no backend
by name.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from enginecache.core.backends.base import Backend, EngineRef
from enginecache.core.backends.registry import all_backends, backend_label, declarations, get_backend
from enginecache.core.fingerprint import GpuInfo, HostFingerprint
from enginecache.service.jobs.refs import engine_targets

if TYPE_CHECKING:  # annotations only: `jobs` words a queued job's wait without the SQLModel tables
    from enginecache.db.models import EngineRecord

WORKER_ALIVE_SECONDS = 15.0  # a worker's liveness lease: a worker whose heartbeat is older is not live

# A worker's `scope` (in its capabilities): "queue" claims any queued job it can run; "job" is the
# CLI's one-shot worker, which claims only the one job it was started for, so no other job may
# count on it (a row without `scope` predates it and is a queue worker).
SCOPE_QUEUE = "queue"
SCOPE_JOB = "job"


def takes_queued_jobs(capabilities: Mapping[str, Any]) -> bool:
    """Whether a worker with these capabilities claims queued jobs generally (not a one-shot one)."""
    return bool(capabilities.get("scope", SCOPE_QUEUE) == SCOPE_QUEUE)


def worker_capabilities(host: HostFingerprint) -> dict[str, Any]:
    """Backends whose library is importable here (found without importing it) with their versions,
    GPUs, CPU target and OS."""
    here = [b for b in all_backends() if importlib.util.find_spec(b.module) is not None]
    return {
        "backends": [b.name for b in here],
        "versions": {b.name: host.packages.get(b.module) for b in here},
        "gpus": [{"name": g.name, "compute_capability": g.compute_capability} for g in host.gpus],
        "cpu_target": host.cpu_target,
        "os": host.os,
    }


def warm_libraries() -> tuple[str, ...]:
    """The backend libraries a worker imports before its first job: those their declarations mark warm."""
    return tuple(d.library for d in declarations() if d.warm)


def build_requirements(
    backend: str, target_info: Mapping[str, Any], backend_version: str, os_name: str
) -> dict[str, Any]:
    """What a worker must have to build this engine: the backend's own answer. Every build needs
    the exact backend version and OS of its cache key, so the engine a worker builds is the one
    that was asked for."""
    return get_backend(backend).build_requirements(target_info, backend_version, os_name)


def load_requirements(engine: EngineRecord) -> dict[str, Any]:
    """What a worker must have to load (test-load) this engine: the backend's answer for its targets
    (the words `requirement_words` gives), the exact library version and OS it was built with, and
    under "engine" the rest of what the backend's compatibility rule decides on, which `can_run` asks."""
    targets = engine_targets(engine)
    requirements = dict(get_backend(engine.backend).load_requirements(targets))
    requirements["backend_version"] = engine.backend_version
    if engine.os:
        requirements["os"] = engine.os
    requirements["engine"] = {"targets": list(targets), "precision": engine.precision}
    return requirements


def capabilities_host(backend: Backend, capabilities: Mapping[str, Any]) -> HostFingerprint:
    """A worker's capabilities as the host `backend`'s compatibility rule takes: its OS, GPUs, CPU
    target and the version of the backend's library it offers."""
    machine, _, level = str(capabilities.get("cpu_target") or "").rpartition("-")
    gpus = tuple(
        GpuInfo(index, str(g.get("name", "")), "", str(g.get("compute_capability", "")), 0)
        for index, g in enumerate(capabilities.get("gpus") or [])
    )
    return HostFingerprint(
        hostname="",
        os=str(capabilities.get("os") or ""),
        os_release="",
        machine=machine,
        python="",
        cpu_model="",
        cpu_isa=(level,) if level and level != "base" else (),
        gpus=gpus,
        nvml="as the worker reported its GPUs",
        packages={backend.module: (capabilities.get("versions") or {}).get(backend.name)},
    )


def can_run(requirements: Mapping[str, Any], capabilities: Mapping[str, Any]) -> bool:
    """Whether a worker with `capabilities` meets `requirements`: for a load (`load_requirements`),
    the backend's compatibility rule on that worker; for a build, a match of the keys any backend
    may use (backend, backend_version, os, compute_capability, compute_capability_any, cpu_target)."""
    backend = requirements.get("backend")
    if backend not in capabilities.get("backends", []):
        return False
    engine = requirements.get("engine")
    if engine is not None:
        loader = get_backend(str(backend))
        ref = EngineRef(
            backend=loader.name,
            backend_version=str(requirements.get("backend_version") or ""),
            targets=tuple(engine.get("targets") or ()),
            precision=str(engine.get("precision") or ""),
            os=requirements.get("os"),
        )
        return loader.compatibility(ref, capabilities_host(loader, capabilities)).compatible
    version = requirements.get("backend_version")
    if version is not None and (capabilities.get("versions") or {}).get(backend) != version:
        return False
    if requirements.get("os") not in (None, capabilities.get("os")):
        return False
    local_cc = {g["compute_capability"] for g in capabilities.get("gpus", [])}
    needed_cc = requirements.get("compute_capability")
    if needed_cc is not None and needed_cc not in local_cc:
        return False
    any_cc = requirements.get("compute_capability_any")
    if any_cc is not None and not local_cc.intersection(any_cc):
        return False
    needed_cpu = requirements.get("cpu_target")
    return needed_cpu is None or needed_cpu == capabilities.get("cpu_target")


def requirement_words(requirements: Mapping[str, Any]) -> str:
    """'TensorRT-RTX 1.7.1 and an SM86 GPU on Linux'; 'an SM86 or SM89 GPU' where any of them will do."""
    backend = str(requirements.get("backend"))
    label = backend_label(backend)
    parts = [f"{label} {requirements['backend_version']}" if requirements.get("backend_version") else label]
    if "compute_capability" in requirements:
        parts.append(f"an {str(requirements['compute_capability']).upper()} GPU")
    if "compute_capability_any" in requirements:
        ccs = [str(cc).upper() for cc in requirements["compute_capability_any"]]
        parts.append(f"an {' or '.join(ccs)} GPU" if ccs else "a GPU")
    if "cpu_target" in requirements:
        parts.append(f"a {requirements['cpu_target']} CPU")
    where = f" on {requirements['os']}" if requirements.get("os") else ""
    return " and ".join(parts) + where


def describe_requirements(requirements: Mapping[str, Any]) -> str:
    """'a worker with TensorRT and an SM86 GPU'."""
    return "a worker with " + requirement_words(requirements)
