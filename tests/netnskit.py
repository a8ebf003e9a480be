"""Hosts for the fleet simulation: Linux network namespaces joined to a bridge by veth pairs.

`Network(["worker-1", ...])` makes a bridge with the address `gateway` in this (the root) namespace
and, per host, a namespace with one interface `eth0` at its own address on the bridge's /24, its
loopback up. A process started with `popen(host, argv)` runs inside that namespace: it reaches the
gateway address (where the suite's PostgreSQL forwarder and S3 server listen) and the other hosts,
and nothing else. `cut(host)` takes the host's link down on the bridge side (its packets are dropped,
its connections stall, as on a pulled cable); `restore(host)` brings it back. `close()` deletes the
namespaces and the bridge (their veth pairs go with them).

Needs CAP_NET_ADMIN (root) and `ip` (iproute2); `skip_or_fail` says so where either is missing.
Names carry this process's id, so two runs on one machine do not collide, and what a killed run
left behind (its process gone) is removed by the next one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from enginecache.core.processes import pid_alive
from tests.conftest import skip_or_fail


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")


def netns_unavailable() -> str | None:
    """Why this process cannot make network namespaces here, or None."""
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if os.geteuid() != 0:
        return "making network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"ecprobe{os.getpid()}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        return f"`ip netns add` is not permitted here: {done.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=60)
    return None


def _remove_stale() -> None:
    """Namespaces and bridges a killed run left (their names carry its pid; it is gone)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=60).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        tag = name[2:].split("-", 1)[0]
        if name.startswith("ec") and "-" in name and tag.isdigit() and not pid_alive(int(tag)):
            with contextlib.suppress(RuntimeError):
                _ip("netns", "del", name)
    links = subprocess.run(["ip", "-o", "link", "show", "type", "bridge"], capture_output=True, text=True, timeout=60)
    for line in links.stdout.splitlines():
        name = line.split(": ")[1].split("@")[0] if ": " in line else ""
        if name.startswith("ecbr") and name[4:].isdigit() and not pid_alive(int(name[4:])):
            with contextlib.suppress(RuntimeError):
                _ip("link", "del", name)


class Network:
    """A bridge and one namespace per host name (module docstring)."""

    def __init__(self, hosts: Sequence[str]) -> None:
        why = netns_unavailable()
        if why is not None:
            skip_or_fail(f"the fleet simulation needs network namespaces: {why}")
        _remove_stale()
        tag = os.getpid()
        self._tag = f"{tag}"
        subnet = 100 + tag % 150  # 10.231.<100..249>.0/24: one per run
        self._prefix = f"10.231.{subnet}"
        self.gateway = f"{self._prefix}.1"
        self.bridge = f"ecbr{self._tag}"
        self.hosts = list(hosts)
        self._made: list[str] = []
        try:
            self._up()
        except BaseException:
            self.close()
            raise

    def namespace(self, host: str) -> str:
        return f"ec{self._tag}-{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        return f"{self._prefix}.{10 + self.hosts.index(host)}"

    def _veth(self, host: str) -> str:
        return f"ecv{self._tag}x{self.hosts.index(host)}"  # the bridge side; at most 15 characters

    def _up(self) -> None:
        _ip("link", "add", "name", self.bridge, "type", "bridge")
        self._made.append("bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.hosts:
            ns, veth, peer = self.namespace(host), self._veth(host), f"ecp{self._tag}"
            _ip("netns", "add", ns)
            self._made.append(ns)
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the host's namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(self.command(host, argv), **kwargs)

    def run(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        return subprocess.run(self.command(host, argv), **kwargs)

    def cut(self, host: str) -> None:
        """The host's link down at the bridge: what it sends is dropped, nothing reaches it."""
        _ip("link", "set", self._veth(host), "down")

    def restore(self, host: str) -> None:
        _ip("link", "set", self._veth(host), "up")

    def close(self) -> None:
        for made in reversed(self._made):
            with contextlib.suppress(RuntimeError):
                if made == "bridge":
                    _ip("link", "del", self.bridge)
                else:
                    _ip("netns", "del", made)  # its veth pair goes with it
        self._made.clear()
