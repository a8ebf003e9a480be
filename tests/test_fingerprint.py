"""The host fingerprint's CPU part comes from /proc/cpuinfo, in-process (no child processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from enginecache.core.fingerprint import cpu_target, host_fingerprint, parse_cpuinfo

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
