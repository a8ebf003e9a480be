"""A real S3-protocol server for the store's tests: moto's standalone server (`python -m moto.server`)
in a subprocess on 127.0.0.1 (or another local address: `S3Server(host=...)`), with IAM authentication
on, so a request signed with wrong keys is refused as AWS refuses it. Not an in-process mock: obstore
talks HTTP to it, and a test can SIGKILL it.

`S3Server.start()` takes a free port, starts the server, waits until it answers (a generous deadline,
no fixed sleeps), creates an IAM user with an access key and an allow-all policy, the bucket, and only
then turns authentication on (`/moto-api/reset-auth`: from then every request must be signed with
the user's keys). `kill()` is SIGKILL; `restart()` starts a fresh server on the same port (moto keeps
its state in memory: the bucket and keys are made again, new keys). `stop()` ends it and removes its
temp folder (its log). `GatedProxy` forwards TCP to the server, counts the bytes each way and, once
told how many request (or response) bytes to let through, holds every byte after that: an upload (or
a download) is then in flight, part way, for as long as the test wants, whatever the machine's speed.

Admin calls (listing uploads, checking a key) use boto3 with the user's keys, straight to the server.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from enginecache.core.processes import die_with_parent
from tests.conftest import skip_or_fail

BUCKET = "enginecache-test"
REGION = "us-east-1"
READY_SECONDS = 90.0
ALLOW_ALL = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def wait_for(condition: Callable[[], bool], what: str, seconds: float = READY_SECONDS) -> None:
    """Poll `condition` until it holds; fail after a generous deadline, saying what was awaited."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.02)


class S3Server:
    """moto's S3 server in a subprocess, with one bucket and one user whose keys it demands."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="s3kit-"))
        self.host = host  # another address for hosts in network namespaces (tests/netnskit.py)
        self.port = free_port(host)
        self.process: subprocess.Popen[bytes] | None = None
        self.access_key = ""
        self.secret_key = ""

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> S3Server:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("boto3") is None:
            skip_or_fail("moto[server] is not installed (a dev dependency: pip install 'moto[server]')")
        log = open(self.folder / "server.log", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MOTO_PORT": str(self.port)},
                preexec_fn=die_with_parent,  # a test run that is killed leaves no server behind
            )
        finally:
            log.close()
        wait_for(self._answers, f"moto server on {self.endpoint}")
        self._provision()
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise AssertionError(f"moto server exited with {self.process.returncode}:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/data.json", timeout=5) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _provision(self) -> None:
        """The user, its keys and policy, the bucket; then every later request must be signed."""
        anonymous = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = self._client("iam", **anonymous)
        iam.create_user(UserName="enginecache")
        iam.put_user_policy(UserName="enginecache", PolicyName="all", PolicyDocument=json.dumps(ALLOW_ALL))
        key = iam.create_access_key(UserName="enginecache")["AccessKey"]
        self.access_key, self.secret_key = key["AccessKeyId"], key["SecretAccessKey"]
        self._client("s3", **anonymous).create_bucket(Bucket=BUCKET)
        request = urllib.request.Request(
            f"{self.endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200

    def _client(self, service: str, **keys: str) -> Any:
        import boto3

        keys = keys or {"aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key}
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION, **keys)

    def s3(self) -> Any:
        """A boto3 S3 client with the user's keys, straight to the server (for checks, not the code)."""
        return self._client("s3")

    def env(self, prefix: str, *, endpoint: str | None = None, **extra: str) -> dict[str, str]:
        """The variables that point enginecache at this server, below `prefix`."""
        return {
            "ENGINECACHE_STORE": f"s3://{BUCKET}/{prefix}",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": endpoint or self.endpoint,
            "AWS_REGION": REGION,
            **extra,
        }

    def keys(self, prefix: str) -> list[str]:
        """Every key below `prefix` in the bucket."""
        listing = self.s3().list_objects_v2(Bucket=BUCKET, Prefix=prefix)
        return [item["Key"] for item in listing.get("Contents", [])]

    def uploads(self, prefix: str) -> list[dict[str, Any]]:
        """The multipart uploads in progress below `prefix`, each with its parts."""
        found = self.s3().list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
        for upload in found:
            parts = self.s3().list_parts(Bucket=BUCKET, Key=upload["Key"], UploadId=upload["UploadId"])
            upload["Parts"] = parts.get("Parts", [])
        return list(found)

    def log(self) -> str:
        path = self.folder / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.is_file() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush; whatever was in flight is cut."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=60)
        self.process = None

    def restart(self) -> S3Server:
        """A fresh server on the same port (moto's state is in memory: new keys, an empty bucket)."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        try:
            if self.process is not None and self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.kill()
            self.process = None
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


@contextlib.contextmanager
def running_server() -> Iterator[S3Server]:
    """A started server, stopped (and its folder removed) afterwards."""
    server = S3Server()
    try:
        yield server.start()
    finally:
        server.stop()


def use_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """Set each of `env` (a server's `env()`: the store, its keys, endpoint and region) for the test."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)


class GatedProxy:
    """TCP from `listen`:<port> (127.0.0.1 by default) to a server at `target_host`:`target_port`,
    a connection upstream per accepted one. `hold_after(n)`: forward the first `n` request bytes
    (client to server, all connections together) and hold the rest; `hold_responses_after(n)` the
    same for response bytes (server to client: a download stops part way, whatever the machine's
    speed); `holding` is set once a byte waits. `sent` and `received` count the request and response
    bytes forwarded (what the server was sent, and sent back). `close()` ends every connection and
    the listener (held bytes are dropped). Ungated, it is a plain forwarder: the fleet simulation
    reaches the loopback-only PostgreSQL through one."""

    def __init__(self, target_port: int, *, listen: str = "127.0.0.1", target_host: str = "127.0.0.1") -> None:
        self.target_port = target_port
        self.target_host = target_host
        self._listener = socket.create_server((listen, 0))
        self.port = int(self._listener.getsockname()[1])
        self.holding = threading.Event()
        self._closed = threading.Event()
        self._limit: int | None = None
        self._response_limit: int | None = None
        self._sent = 0
        self._received = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self._listener]
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold_after(self, limit: int) -> None:
        with self._lock:
            self._limit = limit

    def hold_responses_after(self, limit: int) -> None:
        with self._lock:
            self._response_limit = limit

    @property
    def sent(self) -> int:
        with self._lock:
            return self._sent

    @property
    def received(self) -> int:
        with self._lock:
            return self._received

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection((self.target_host, self.target_port), timeout=30)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            self._spawn(self._pump, client, upstream, True)
            self._spawn(self._pump, upstream, client, False)

    def _allowance(self, wanted: int, request: bool) -> int:
        """How many of `wanted` request (or response) bytes may go now (0: hold them until closed)."""
        with self._lock:
            limit, done = (self._limit, self._sent) if request else (self._response_limit, self._received)
            allowed = wanted if limit is None else max(0, min(wanted, limit - done))
            if request:
                self._sent += allowed
            else:
                self._received += allowed
            return allowed

    def _pump(self, source: socket.socket, sink: socket.socket, request: bool) -> None:
        try:
            while data := source.recv(65536):
                allowed = self._allowance(len(data), request)
                sink.sendall(data[:allowed])
                if allowed < len(data):
                    self.holding.set()
                    self._closed.wait()  # held: nothing more goes through
                    return
        except OSError:
            pass  # either side went away: the other is closed below, as a cut connection is
        finally:
            for end in (source, sink):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(timeout=30)
