"""This host as `enginecache fingerprint` shows it: OS, CPU and ISA, GPUs (NVML), driver, the CUDA
runtime (probed), library versions. The fingerprint is taken anew on each call."""

from __future__ import annotations

from enginecache.core.fingerprint import HostFingerprint, host_fingerprint


def this_host() -> HostFingerprint:
    """The full fingerprint of this host, the CUDA runtime's version included."""
    return host_fingerprint(probe_cuda_runtime=True)
