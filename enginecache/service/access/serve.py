"""`enginecache serve`: the dashboard (a `streamlit run` subprocess) and one local worker (an
`enginecache worker` subprocess) on one catalog, supervised together.

Both children get ENGINECACHE_HOME and ENGINECACHE_DB_URL, run in their own sessions (a
terminal's ^C reaches only the supervisor, which decides the order), and die with the
supervisor (PR_SET_PDEATHSIG on Linux) even if it is killed outright. SIGINT/SIGTERM: stop the
dashboard, ask the worker to finish its running job (a second signal or the grace period
hands the job back to the queue), then exit. If either child exits, the other is stopped too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from enginecache.core.processes import die_with_parent
from enginecache.errors import ServeError
from enginecache.service.context import DB_URL_ENV, HOME_ENV, AppContext

logger = logging.getLogger(__name__)

# The dashboard script, found beside this package (editable or installed alike) without
# importing `dashboard` (service must not depend on the layer above it).
APP_PATH = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
DEFAULT_PORT = 8501
DEFAULT_MAX_UPLOAD_MB = 2048
HEALTH_PATH = "/_stcore/health"


@dataclass(frozen=True)
class ServeSpec:
    home: Path
    db_url: str
    port: int = DEFAULT_PORT
    address: str | None = None
    max_upload_mb: int = DEFAULT_MAX_UPLOAD_MB
    worker: bool = True
    worker_name: str | None = None
    stop_grace_seconds: float = 30.0
    extra_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_app(cls, app: AppContext, **kwargs: object) -> ServeSpec:
        return cls(home=app.home, db_url=app.db_url, **kwargs)  # type: ignore[arg-type]


def child_env(spec: ServeSpec) -> dict[str, str]:
    env = dict(os.environ)
    env[HOME_ENV] = str(spec.home)
    env[DB_URL_ENV] = spec.db_url
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(spec.extra_env)
    return env


def dashboard_command(spec: ServeSpec) -> list[str]:
    command = [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP_PATH),
        "--server.port",
        str(spec.port),
        "--server.headless",
        "true",
        "--server.maxUploadSize",
        str(spec.max_upload_mb),
        "--server.fileWatcherType",
        "none",
        "--server.runOnSave",
        "false",
        "--browser.gatherUsageStats",
        "false",
        "--client.showErrorDetails",
        "type",
        "--client.toolbarMode",
        "minimal",
    ]
    if spec.address:
        command += ["--server.address", spec.address]
    return command


def worker_command(spec: ServeSpec) -> list[str]:
    name = spec.worker_name or f"serve-{socket.gethostname()}-{os.getpid()}"
    return [sys.executable, "-m", "enginecache.cli", "worker", "--name", name]


def check_port_free(port: int, address: str | None = None) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address or "0.0.0.0", port))
        except OSError as err:
            raise ServeError(f"port {port} is not free ({err.strerror}); choose another with --port") from err


def _child_setup() -> None:
    """In the child before exec: own session, and die when the supervisor dies."""
    os.setsid()
    with contextlib.suppress(OSError):  # the child runs on, as it would where the OS has no such request
        die_with_parent(signal.SIGTERM)


def start_child(command: list[str], env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    try:
        return subprocess.Popen(command, env=env, cwd=cwd, preexec_fn=_child_setup)
    except OSError as err:
        raise ServeError(f"cannot start {command[0]}: {err}") from err


def wait_healthy(port: int, *, timeout: float = 60.0, alive: Callable[[], bool] = lambda: True) -> bool:
    """Poll Streamlit's health endpoint until it answers ok, the child dies, or time runs out."""
    deadline = time.monotonic() + timeout
    url = f"http://127.0.0.1:{port}{HEALTH_PATH}"
    while time.monotonic() < deadline and alive():
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    return False


def _stop(process: subprocess.Popen[bytes], name: str, grace: float, *, second_signal: bool = False) -> None:
    """SIGTERM, wait; optionally a second SIGTERM (the worker's "hand back now"); then SIGKILL."""
    if process.poll() is not None:
        return
    logger.info("stopping %s (pid %s)", name, process.pid)
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace)
        return
    except subprocess.TimeoutExpired:
        pass
    if second_signal and process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
            return
        except subprocess.TimeoutExpired:
            pass
    if process.poll() is None:
        logger.warning("%s did not stop; killing it", name)
        process.kill()
        process.wait()


@contextlib.contextmanager
def _stop_signals(stop: threading.Event) -> Iterator[None]:
    """SIGINT/SIGTERM only set a flag (the main loop does the stopping)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@dataclass
class Served:
    """What `serve` started; `url` once the dashboard answered its health check."""

    dashboard: subprocess.Popen[bytes]
    worker: subprocess.Popen[bytes] | None
    url: str


def start(spec: ServeSpec) -> Served:
    """Start the dashboard and the worker; raises ServeError if the dashboard never gets healthy."""
    check_port_free(spec.port, spec.address)
    env = child_env(spec)
    worker = start_child(worker_command(spec), env) if spec.worker else None
    dashboard = start_child(dashboard_command(spec), env)
    served = Served(dashboard, worker, f"http://{spec.address or 'localhost'}:{spec.port}")
    if not wait_healthy(spec.port, alive=lambda: dashboard.poll() is None):
        stop(served, spec)
        raise ServeError(f"the dashboard did not start on port {spec.port} (exit status {dashboard.poll()})")
    return served


def stop(served: Served, spec: ServeSpec) -> None:
    _stop(served.dashboard, "dashboard", 10.0)
    if served.worker is not None:
        _stop(served.worker, "worker", spec.stop_grace_seconds, second_signal=True)


def run_serve(spec: ServeSpec, *, on_ready: Callable[[Served], None] | None = None) -> int:
    """Serve until SIGINT/SIGTERM or until a child exits; returns the exit status (0 when stopped)."""
    stop_event = threading.Event()
    with _stop_signals(stop_event):
        served = start(spec)
        if on_ready is not None:
            on_ready(served)
        code = 0
        try:
            while not stop_event.wait(0.5):
                for name, process in (("dashboard", served.dashboard), ("worker", served.worker)):
                    if process is not None and process.poll() is not None:
                        logger.error("%s exited with status %s; stopping", name, process.returncode)
                        code = process.returncode or 1
                        stop_event.set()
        finally:
            stop(served, spec)
    return code
