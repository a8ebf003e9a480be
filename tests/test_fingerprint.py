"""The host fingerprint's CPU part comes from /proc/cpuinfo, in-process (no child processes); its GPU
part is `core.gpufacts.gpu_facts()`, NVML asked once and its answer kept per host state, and patched
there (`gpufacts._nvml_gpus`, its paths) or where `host_fingerprint` calls it (`fingerprint.gpu_facts`)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from enginecache.core import fingerprint, gpufacts
from enginecache.core.fingerprint import GpuInfo, cpu_target, host_fingerprint, parse_cpuinfo
from enginecache.core.gpufacts import GpuFacts
from enginecache.service.serving.localhost import forget_local_host, local_host
from tests.servingkit import run_python

X86 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13 64-Core Processor
flags\t\t: fpu vme sse4_2 avx avx2 fma

processor\t: 1
model name\t: another CPU that is not read
flags\t\t: fpu
"""

ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes crc32
CPU implementer\t: 0x41
"""


def test_x86_model_and_flags_come_from_the_first_processor_block() -> None:
    model, flags = parse_cpuinfo(X86)
    assert model == "AMD EPYC 7B13 64-Core Processor"
    assert flags == ("avx", "avx2", "fma", "fpu", "sse4_2", "vme")
    assert cpu_target("x86_64", flags) == "x86_64-avx2"


def test_arm_features_are_its_flags() -> None:
    _, flags = parse_cpuinfo(ARM)
    assert "asimd" in flags
    assert cpu_target("aarch64", flags) == "aarch64-asimd"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/cpuinfo is Linux's")
def test_fingerprinting_spawns_no_process() -> None:
    """py-cpuinfo re-ran Python and spawned lscpu/dmesg on every start; the fingerprint must not."""
    code = (
        "import subprocess, os\n"
        "spawned = []\n"
        "real = subprocess.Popen.__init__\n"
        "def spy(self, *a, **k):\n"
        "    spawned.append(a[0] if a else k.get('args'))\n"
        "    real(self, *a, **k)\n"
        "subprocess.Popen.__init__ = spy\n"
        "os.posix_spawn = os.posix_spawnp = lambda *a, **k: spawned.append(a)\n"
        "from enginecache.core.fingerprint import host_fingerprint\n"
        "fp = host_fingerprint()\n"
        "assert fp.cpu_isa and fp.cpu_model != 'unknown', fp\n"
        "print(spawned)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    assert host_fingerprint().cpu_target.startswith(host_fingerprint().machine)


# -- library versions, NVML once, and its answer kept per host state ---------------------------


def test_distribution_versions_are_what_importlib_metadata_says() -> None:
    from importlib import metadata

    from enginecache.core.fingerprint import distribution_version

    names = {dist.metadata["Name"] for dist in metadata.distributions()}
    assert len(names) > 10
    for name in sorted(names):
        assert distribution_version(name) == metadata.version(name), name
    assert distribution_version("surely-not-installed-enginecache-test") is None


FAKE_GPU = GpuInfo(index=0, name="NVIDIA A10", uuid="GPU-1", compute_capability="sm86", memory_total_bytes=24 << 30)


@pytest.fixture
def counted_nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """NVML replaced by a fake A10 that counts its calls; the disk cache in tmp_path; every
    in-process cache cleared before and after, so no other test sees the fake GPU."""
    calls: list[int] = []

    def fake_nvml() -> tuple[str, tuple[GpuInfo, ...], str | None, str | None]:
        calls.append(1)
        return "ok", (FAKE_GPU,), "580.1", "13.0"

    monkeypatch.setattr(gpufacts, "_nvml_gpus", fake_nvml)
    monkeypatch.setenv(gpufacts.HOST_GPUS_CACHE_ENV, str(tmp_path / "host-gpus.json"))
    gpufacts.gpu_facts.cache_clear()
    forget_local_host()
    yield calls
    gpufacts.gpu_facts.cache_clear()
    forget_local_host()


@pytest.mark.skipif(not os.path.isfile(gpufacts.BOOT_ID), reason="needs a boot id (Linux)")
def test_nvml_is_asked_once_and_its_answer_kept_while_the_host_state_stands(
    counted_nvml: list[int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert host_fingerprint().gpus == (FAKE_GPU,) and host_fingerprint().driver_version == "580.1"
    assert len(counted_nvml) == 1, "NVML once per process"
    gpufacts.gpu_facts.cache_clear()  # a new process: answered from the disk cache
    assert host_fingerprint().gpus == (FAKE_GPU,) and len(counted_nvml) == 1
    driver = tmp_path / "nvidia-version"
    driver.write_text("NVRM version: 580.1\n")
    monkeypatch.setattr(gpufacts, "NVIDIA_DRIVER_VERSION", driver)
    gpufacts.gpu_facts.cache_clear()
    host_fingerprint()
    assert len(counted_nvml) == 2, "a (re)loaded driver asks NVML again"
    gpufacts.gpu_facts.cache_clear()
    host_fingerprint()
    assert len(counted_nvml) == 2
    driver.write_text("NVRM version: 590.2\n")
    gpufacts.gpu_facts.cache_clear()
    host_fingerprint()
    assert len(counted_nvml) == 3, "another driver version"
    monkeypatch.setattr(gpufacts, "read_boot_id", lambda: "another-boot")
    gpufacts.gpu_facts.cache_clear()
    host_fingerprint()
    assert len(counted_nvml) == 4, "a reboot"
    monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", "1")
    gpufacts.gpu_facts.cache_clear()
    host_fingerprint()
    assert len(counted_nvml) == 5, "another share of the GPUs"


def test_a_transient_nvml_error_is_not_kept(counted_nvml: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpufacts, "_nvml_gpus", lambda: ("error: GPU is lost", (), None, None))
    assert host_fingerprint().nvml == "error: GPU is lost"
    monkeypatch.setattr(gpufacts, "_nvml_gpus", lambda: ("ok", (FAKE_GPU,), "580.1", "13.0"))
    gpufacts.gpu_facts.cache_clear()
    assert host_fingerprint().gpus == (FAKE_GPU,)


def test_a_cpu_backend_lookup_skips_nvml(counted_nvml: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    cpu_only = host_fingerprint(probe_gpus=False)
    assert counted_nvml == [] and cpu_only.gpus == () and cpu_only.nvml.startswith("not probed")
    assert local_host(probe_gpus=False).gpus == () and counted_nvml == []
    assert local_host().gpus == (FAKE_GPU,) and local_host(probe_gpus=False).gpus == (FAKE_GPU,)
    monkeypatch.setenv(gpufacts.HOST_GPUS_CACHE_ENV, "off")
    assert gpufacts.host_gpus_cache_path() is None


def test_host_fingerprint_reports_the_gpu_facts_named_in_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """`host_fingerprint` calls `gpu_facts` by the name `core.fingerprint` binds, so patching that name
    (a test's fake GPU host) changes what it reports; `probe_gpus=False` does not ask it."""
    asked: list[int] = []

    def fake_facts() -> GpuFacts:
        asked.append(1)
        return GpuFacts("ok", (FAKE_GPU,), "999.1", "12.9")

    monkeypatch.setattr(fingerprint, "gpu_facts", fake_facts)
    host = host_fingerprint()
    assert (host.gpus, host.driver_version, host.cuda_driver_version, host.nvml) == ((FAKE_GPU,), "999.1", "12.9", "ok")
    assert asked == [1]
    assert host_fingerprint(probe_gpus=False).gpus == () and asked == [1]


def test_the_gpu_names_are_still_importable_from_the_fingerprint() -> None:
    assert fingerprint.GpuInfo is gpufacts.GpuInfo and fingerprint.GpuFacts is gpufacts.GpuFacts
    assert fingerprint.gpu_facts is gpufacts.gpu_facts


def test_a_new_process_with_a_kept_answer_does_not_load_nvml(tmp_path: Path) -> None:
    code = (
        "import json, sys, time\n"
        "started = time.perf_counter()\n"
        "from enginecache.core.fingerprint import host_fingerprint\n"
        "host = host_fingerprint()\n"
        "print(json.dumps({'nvml': host.nvml, 'pynvml': 'pynvml' in sys.modules,"
        " 'metadata': 'importlib.metadata' in sys.modules, 'seconds': time.perf_counter() - started}))\n"
    )
    env = {gpufacts.HOST_GPUS_CACHE_ENV: str(tmp_path / "host-gpus.json")}
    first = run_python(code, env=env)
    second = run_python(code, env=env)
    assert second["nvml"] == first["nvml"] and second["pynvml"] is False and second["metadata"] is False
