"""Starting `enginecache serve` in the end-to-end tests: its command, a free port, waiting for the
dashboard, stopping it, and the Debian Chromium every browser test drives, with its flags and
Playwright's limit."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
# Generous: the machines are shared, and a wait ends as soon as its condition holds.
TIMEOUT_MS = 60_000  # every Playwright action, navigation and expect()
HEALTH_SECONDS = 120.0  # `enginecache serve` answering /_stcore/health
POLL_SECONDS = 0.5  # how often the health endpoint is polled (not a margin)


def serve_command(home: Path, port: int, *options: str) -> list[str]:
    """`enginecache --home HOME serve --port PORT [OPTIONS]`, run by this interpreter."""
    return [sys.executable, "-m", "enginecache.cli", "--home", str(home), "serve", "--port", str(port), *options]


def stop_serve(process: subprocess.Popen[bytes], timeout: float) -> str:
    """SIGTERM `process` and wait up to `timeout` seconds for it to end (killed after that); its output."""
    process.send_signal(signal.SIGTERM)
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
    return out.decode(errors="replace")


def free_port() -> int:
    """A port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_dashboard(port: int, process: subprocess.Popen[bytes], timeout: float = HEALTH_SECONDS) -> None:
    """Until the dashboard answers /_stcore/health with ok; AssertionError if `process` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"enginecache serve exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                if response.read() == b"ok":
                    return
        except OSError:
            pass  # not listening yet: poll again until the deadline
        time.sleep(POLL_SECONDS)
    raise AssertionError(f"the dashboard never answered /_stcore/health within {timeout:.0f} s")
