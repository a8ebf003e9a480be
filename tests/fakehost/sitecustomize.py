"""TEST-ONLY fake host facts for the fleet simulation (tests/test_fleet_netns.py): never on a real host.

Put on PYTHONPATH of a simulated host's processes (its worker, the worker's zygote and job
children, its serving process). What it fakes is what no machine here has: a GPU of a given class,
and the GPU side of a TensorRT runtime.

- `ENGINECACHE_TEST_FAKE_GPU="sm86:NVIDIA RTX A6000"`: the host fingerprint reports that GPU
  (`enginecache.core.fingerprint.gpu_facts` is replaced), so the worker advertises that GPU class
  and `profiles`/`pull` choose for it. Everything else in the fingerprint is this machine's.
- `ENGINECACHE_TEST_FAKE_GPU_RUNTIME=1`: the TensorRT backends' GPU side is a fake: the header
  validity check (TensorRT-RTX reads the GPU's properties for it) passes, and `load` returns a
  session holding the verified bytes (their sha256 is its `engine_sha256`) instead of
  deserializing them on a GPU. The read and its verification, the
  manifest, the compatibility rule and the readiness state are the product's own.
"""

from __future__ import annotations

import hashlib
import os

FAKE_GPU_ENV = "ENGINECACHE_TEST_FAKE_GPU"
FAKE_RUNTIME_ENV = "ENGINECACHE_TEST_FAKE_GPU_RUNTIME"


def _fake_gpu(spec: str) -> None:
    from enginecache.core import fingerprint

    cc, _, name = spec.partition(":")
    gpu = fingerprint.GpuInfo(
        index=0,
        name=f"{name or 'GPU'} (test-only fake)",
        uuid=f"GPU-fake-{cc}",
        compute_capability=cc,
        memory_total_bytes=24 << 30,
    )
    facts = fingerprint.GpuFacts("ok (test-only fake GPU)", (gpu,), "000.00-fake", "12.8")
    fingerprint.gpu_facts = lambda: facts  # type: ignore[assignment]


class FakeGpuSession:
    """Stands in for a TensorRT session on a GPU (test-only): holds what it was given."""

    io: tuple[object, ...] = ()

    def __init__(self, backend: str, engine: bytes | bytearray | memoryview) -> None:
        self.backend = backend
        self.engine_sha256 = hashlib.sha256(memoryview(engine)).hexdigest()

    def infer(self, feeds: object) -> dict[str, object]:
        raise RuntimeError("a fake GPU session (test-only) runs nothing")

    def close(self) -> None:
        return None


def _fake_runtime() -> None:
    from enginecache.core.backends.trt.backend import TensorRTBackend

    TensorRTBackend.check_header = lambda self, header, spec, timer=None: None  # type: ignore[method-assign]
    TensorRTBackend.check_compatibility = TensorRTBackend.compatibility  # type: ignore[method-assign]
    TensorRTBackend.load = lambda self, engine, spec, timer=None: FakeGpuSession(self.name, engine)  # type: ignore[method-assign]


if os.environ.get(FAKE_GPU_ENV):
    _fake_gpu(os.environ[FAKE_GPU_ENV])
if os.environ.get(FAKE_RUNTIME_ENV) == "1":
    _fake_runtime()
