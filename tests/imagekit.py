"""Build and run the project's images with buildah and podman on a host that reaches no image
registry (this one, and CI): a Debian bookworm base made locally stands in for `python:3.11-slim`
(bookworm's python3 is 3.11) and for NVIDIA's TensorRT image.

The base (`base_image`): `debootstrap --variant=minbase` of bookworm from this host's apt mirror,
with python3, python3-venv and python3-pip; `python` and `pip` as in the python image (PEP 668's
marker removed, so `pip install` installs system-wide); the certificate authorities this host adds
to its own trust (/usr/local/share/ca-certificates: an egress proxy that inspects TLS, here), so
`pip` inside a build reaches PyPI as the host does. It is imported once per recipe: its tag names
the hash of the recipe (the code that makes it) and of those certificates, so repeated runs reuse
it, a changed recipe makes a new one (the old one is untagged, and removed with what was built on it
once no kept image stands on it), and a host without it makes it (2.5 to 4.5 minutes on 2 cores).

This host's container runtime needs three things said (what each works around):
- builds run with `--isolation chroot` and the host's network (no OCI runtime: crun 1.8 refuses
  this host's hybrid cgroups, and pip reaches PyPI through the host's network);
- containers run with runc (`--runtime runc`), which handles cgroup v1, not crun;
- rlimits no higher than the host's own (podman asks for 1048576 open files and 4194304 processes
  by default, above this host's hard limits, which its root may not raise).

Every subprocess has a timeout; `Containers` removes the containers it started. The last build of
each Dockerfile stays (BUILT_REPO:cpu, :gpu): its layers are the next build's cache, and what no
kept image stands on is removed after each build.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import resource
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("buildah", "podman", "debootstrap", "runc")
INSTALL_HINT = "apt-get install buildah podman debootstrap runc"
BASE_REPO = "localhost/enginecache-base"
BASE_LABEL = "org.enginecache.test-base"  # on the base, so on every image (and cached layer) built on it
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "python3-pip", "ca-certificates")
HOST_CAS = Path("/usr/local/share/ca-certificates")
DEFAULT_MIRROR = "http://deb.debian.org/debian"

DEBOOTSTRAP_SECONDS = 900
IMPORT_SECONDS = 300
BUILD_SECONDS = 900
PODMAN_SECONDS = 120
NPROC_LIMIT = 4096  # processes per container: lower than the host's, so runc may set it
BUILT_REPO = "localhost/enginecache-test"  # the last build of each Dockerfile, kept as the next build's cache
LOCK = Path("/var/tmp/enginecache-image.lock")
LOCK_SECONDS = 2400  # a cold start: the base, then both images' dependencies


class ImageToolError(RuntimeError):
    """A buildah/podman/debootstrap step failed: the command and the tail of what it printed."""


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def run(args: Sequence[str], *, timeout: float) -> str:
    """Run a tool to completion within `timeout` seconds; its stdout, or ImageToolError naming the
    command and the last lines it printed."""
    try:
        done = subprocess.run(list(args), capture_output=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as err:
        raise ImageToolError(f"{' '.join(args)}: no answer within {timeout:g} s") from err
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).decode(errors="replace").strip().splitlines()[-25:]
        raise ImageToolError(f"{' '.join(args)}: exit status {done.returncode}\n" + "\n".join(tail))
    return done.stdout.decode(errors="replace")


# -- the base --------------------------------------------------------------------------------


def apt_mirror(sources: Sequence[Path] = (Path("/etc/apt/sources.list.d/debian.sources"),)) -> str:
    """The Debian mirror this host's apt uses (its first `URIs:` in deb822 sources, or the first
    `deb` line of sources.list), else deb.debian.org."""
    for path in sources:
        if path.is_file():
            for line in path.read_text().splitlines():
                if line.startswith("URIs:") and "security" not in line:
                    return line.split()[1]
    legacy = Path("/etc/apt/sources.list")
    if legacy.is_file():
        for line in legacy.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and "security" not in parts[1]:
                return parts[1]
    return DEFAULT_MIRROR


def _host_cas() -> list[Path]:
    return sorted(HOST_CAS.glob("*.crt")) if HOST_CAS.is_dir() else []


def base_key() -> str:
    """What the base is made from: the suite, the packages, the code that makes it (so an edit
    elsewhere in this file keeps the base) and the host's added certificate authorities."""
    digest = hashlib.sha256(repr((SUITE, PACKAGES)).encode())
    for maker in (_make_base, _finish_rootfs):
        digest.update(inspect.getsource(maker).encode())
    for ca in _host_cas():
        digest.update(ca.name.encode() + b"\0" + ca.read_bytes())
    return digest.hexdigest()[:16]


def image_exists(ref: str) -> bool:
    try:
        run(["podman", "image", "exists", ref], timeout=PODMAN_SECONDS)
    except ImageToolError:
        return False
    return True


def base_image() -> str:
    """The local bookworm base for this recipe, made (and older recipes' bases removed) where absent."""
    ref = f"{BASE_REPO}:{SUITE}-{base_key()}"
    with exclusive():
        if not image_exists(ref):
            _make_base(ref)
    return ref


def _make_base(ref: str) -> None:
    with tempfile.TemporaryDirectory(prefix="enginecache-base-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(rootfs),
                apt_mirror(),
            ],
            timeout=DEBOOTSTRAP_SECONDS,
        )
        _finish_rootfs(rootfs)
        archive = Path(tmp) / "rootfs.tar"
        run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(archive), "."], timeout=IMPORT_SECONDS)
        changes = ["--change", 'CMD ["python3"]', "--change", f"LABEL {BASE_LABEL}={ref}"]
        run(["podman", "import", *changes, str(archive), ref], timeout=IMPORT_SECONDS)
    for old in run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}", BASE_REPO], timeout=60).split():
        if old != ref:  # an older recipe's base: untagged here, removed with its images once none is kept
            run(["podman", "untag", old, old], timeout=PODMAN_SECONDS)


def _finish_rootfs(rootfs: Path) -> None:
    """`python`, `pip` and a system-wide `pip install` as in the python image; the host's added
    certificate authorities trusted; no apt lists or downloaded packages."""
    (rootfs / "usr/lib/python3.11/EXTERNALLY-MANAGED").unlink(missing_ok=True)
    for name, target in (("python", "python3"), ("pip", "pip3")):
        link = rootfs / "usr/bin" / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    cas = _host_cas()
    for ca in cas:
        shutil.copyfile(ca, rootfs / "usr/local/share/ca-certificates" / ca.name)
    if cas:
        run(["chroot", str(rootfs), "update-ca-certificates"], timeout=120)
    for folder in ("var/lib/apt/lists", "var/cache/apt/archives"):
        for entry in (rootfs / folder).glob("*"):
            if entry.is_file():
                entry.unlink()


# -- building and running --------------------------------------------------------------------


@contextlib.contextmanager
def exclusive(timeout: float = LOCK_SECONDS) -> Iterator[None]:
    """One image job at a time on this host (the suite's two workers, and runs side by side): making
    the base, and building with the pruning that follows it (which must not see another build's
    layers half made)."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with LOCK.open("a") as handle:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ImageToolError(f"{LOCK} held by another image job for {timeout:g} s") from None
                time.sleep(1.0)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build(dockerfile: str, name: str, *, base: str, build_args: dict[str, str] | None = None) -> str:
    """`buildah build` of the repository's `dockerfile` (context: the checkout, as .dockerignore trims
    it) on `base` (replacing its first FROM; or given to a build argument), tagged BUILT_REPO:`name`.
    Layers are cached: the dependency layer is reused while pyproject.toml and the base stay the same;
    then what no kept image stands on is removed (`_prune_stale_layers`), so older layers do not
    pile up. Returns the tag."""
    tag = f"{BUILT_REPO}:{name}"
    args = ["buildah", "build", "--isolation", "chroot", "--layers", "--format", "docker"]
    args += ["-f", str(ROOT / dockerfile), "-t", tag]
    if build_args is None:
        args += ["--from", base]
    for key, value in (build_args or {}).items():
        args += ["--build-arg", f"{key}={value}"]
    with exclusive():
        run([*args, str(ROOT)], timeout=BUILD_SECONDS)
        _prune_stale_layers()
    return tag


def _prune_stale_layers() -> None:
    """Remove untagged images built on one of our bases (BASE_LABEL, which images inherit) that no
    kept image (a BUILT_REPO or BASE_REPO tag) stands on: older dependency layers, an older build's
    code layers, an older recipe's base and what was built on it."""
    images = _all_images()
    kept = [
        image.layers
        for image in images.values()
        if any(n.startswith((BUILT_REPO + ":", BASE_REPO + ":")) for n in image.names)
    ]
    for image_id, image in images.items():
        if image.names or BASE_LABEL not in image.labels:
            continue
        if not any(keep[: len(image.layers)] == image.layers for keep in kept):
            run(["podman", "rmi", "--force", "--ignore", image_id], timeout=PODMAN_SECONDS)


@dataclass(frozen=True)
class _Image:
    names: list[str]
    labels: dict[str, str]
    layers: list[str]


def _all_images() -> dict[str, _Image]:
    """Every image, intermediate layers included, by id."""
    listed = json.loads(run(["podman", "images", "--all", "--format", "json"], timeout=PODMAN_SECONDS))
    if not listed:
        return {}
    inspected = json.loads(run(["podman", "image", "inspect", *(i["Id"] for i in listed)], timeout=PODMAN_SECONDS))
    return {
        one["Id"]: _Image(
            list(one.get("RepoTags") or []), dict(one["Config"].get("Labels") or {}), list(one["RootFS"]["Layers"])
        )
        for one in inspected
    }


def image_config(tag: str) -> dict[str, object]:
    """The image's config (Env, Cmd, Entrypoint, User ...) as podman reports it."""
    (inspected,) = json.loads(run(["podman", "image", "inspect", tag], timeout=PODMAN_SECONDS))
    return dict(inspected["Config"])


def rlimits() -> list[str]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    procs = min(NPROC_LIMIT, resource.getrlimit(resource.RLIMIT_NPROC)[0])
    return ["--ulimit", f"nofile={soft}:{hard}", "--ulimit", f"nproc={procs}:{procs}"]


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Container:
    name: str
    host_port: int

    def exec(self, *args: str, timeout: float = PODMAN_SECONDS) -> str:
        return run(["podman", "exec", self.name, *args], timeout=timeout)

    def logs(self) -> str:
        done = subprocess.run(["podman", "logs", self.name], capture_output=True, timeout=PODMAN_SECONDS)
        return (done.stdout + done.stderr).decode(errors="replace")

    def healthy(self) -> bool:
        """The image's own HEALTHCHECK, run once (`podman healthcheck run`: exit 0 when healthy)."""
        try:
            run(["podman", "--runtime", "runc", "healthcheck", "run", self.name], timeout=PODMAN_SECONDS)
        except ImageToolError:
            return False
        return True

    def running(self) -> bool:
        state = run(["podman", "inspect", "--format", "{{.State.Running}}", self.name], timeout=PODMAN_SECONDS)
        return state.strip() == "true"


@dataclass
class Containers:
    """Starts containers of one image and removes every one it started (`close`)."""

    image: str
    started: list[str] = field(default_factory=list)

    def start(self, *, env: dict[str, str] | None = None, volumes: Sequence[str] = ()) -> Container:
        """`podman run -d` with its port 8501 published on 127.0.0.1 at a free port."""
        name = f"enginecache-test-{time.monotonic_ns()}"
        port = free_port()
        args = ["podman", "--runtime", "runc", "run", "-d", "--name", name, *rlimits()]
        args += ["-p", f"127.0.0.1:{port}:8501"]
        for key, value in (env or {}).items():
            args += ["-e", f"{key}={value}"]
        for volume in volumes:
            args += ["-v", volume]
        self.started.append(name)
        run([*args, self.image], timeout=PODMAN_SECONDS)
        return Container(name, port)

    def close(self) -> None:
        for name in self.started:
            with contextlib.suppress(ImageToolError):
                run(["podman", "--runtime", "runc", "rm", "--force", "--time", "5", name], timeout=PODMAN_SECONDS)
        self.started.clear()


@contextlib.contextmanager
def containers(image: str) -> Iterator[Containers]:
    started = Containers(image)
    try:
        yield started
    finally:
        started.close()


def host_health(port: int, *, timeout: float = 3.0) -> bytes | None:
    """The dashboard's health answer through the published port, or None where nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=timeout) as answer:
            return bytes(answer.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


INSIDE_HEALTH = (
    "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).read())"
)


def wait_until_serving(container: Container, *, deadline_seconds: float = 180.0) -> None:
    """Wait until the dashboard answers its health endpoint inside the container (where it listens,
    loopback or not); ImageToolError with the container's log where it stops or the deadline passes."""
    deadline = time.monotonic() + deadline_seconds
    last = "no attempt"
    while time.monotonic() < deadline:
        if not container.running():
            raise ImageToolError(f"container {container.name} exited:\n{container.logs()[-4000:]}")
        try:
            if "b'ok'" in container.exec("python", "-c", INSIDE_HEALTH, timeout=30):
                return
        except ImageToolError as err:  # not listening yet: asked again until the deadline
            last = str(err).splitlines()[-1]
        time.sleep(1.0)
    raise ImageToolError(f"no health answer within {deadline_seconds:g} s (last: {last}):\n{container.logs()[-4000:]}")
