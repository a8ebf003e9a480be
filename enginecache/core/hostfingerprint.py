"""The host fingerprint's value: what `core.fingerprint.host_fingerprint` finds of a host, and what a
backend's compatibility rule decides on (a worker's as the catalog keeps it: `to_dict`/`from_dict`).

Apart from the probing, so a backend names the type without importing the fingerprint, which asks
the backend registry which libraries to report.
"""

from __future__ import annotations

from enginecache.core.gpufacts import GpuInfo
from enginecache.core.valuetype import Frozen, field

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from typing import Any

# ISA levels we name an ORT target by, best first.
_ISA_LEVELS: tuple[str, ...] = ("avx512f", "avx2", "avx", "sse4_2", "neon", "asimd")


class HostFingerprint(Frozen):
    hostname: str
    os: str
    os_release: str
    machine: str
    python: str
    cpu_model: str
    cpu_isa: tuple[str, ...]
    gpus: tuple[GpuInfo, ...] = ()
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cuda_runtime_version: str | None = None
    nvml: str = "unavailable"
    packages: dict[str, str | None] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = self.asdict()
        data["cpu_isa"] = list(self.cpu_isa)
        data["gpus"] = [g.asdict() for g in self.gpus]
        data["packages"] = dict(self.packages)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HostFingerprint:
        """The inverse of `to_dict` (a worker's fingerprint as the catalog keeps it)."""
        fields = {k: v for k, v in data.items() if k in cls._fields}
        fields["cpu_isa"] = tuple(data.get("cpu_isa") or ())
        fields["gpus"] = tuple(GpuInfo(**g) for g in data.get("gpus") or ())
        fields["packages"] = dict(data.get("packages") or {})
        return cls(**fields)

    @property
    def cpu_target(self) -> str:
        """The ORT target name for this CPU: `<machine>-<best ISA level>`."""
        return cpu_target(self.machine, self.cpu_isa)


def cpu_target(machine: str, isa: tuple[str, ...] | list[str]) -> str:
    flags = set(isa)
    best = next((level for level in _ISA_LEVELS if level in flags), "base")
    return f"{machine}-{best}"
