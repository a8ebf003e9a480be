"""The images built and run: `Dockerfile` on a locally made Debian bookworm base (no image registry
is reachable here; tests.imagekit says how the base is made and why each podman setting), run as
the README says, its health endpoint asked through the published port and one build made inside;
`Dockerfile.gpu` built with NVIDIA's TensorRT image substituted by that same base.

Needs root with buildah, podman, debootstrap and runc (`.ci/run` installs them under CI). The first
run on a host makes the base and both images' dependency layers (9.5 minutes on 2 cores, the two
tests on the suite's two workers); later runs reuse them while pyproject.toml and the base recipe
stay the same.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import imagekit
from tests.conftest import skip_or_fail
from tests.modelfactory import make_mlp

pytestmark = [pytest.mark.slow, pytest.mark.timeout(imagekit.LOCK_SECONDS + 600)]

LOGIN_SECRETS = (
    '[auth]\nredirect_uri = "http://localhost:8501/oauth2callback"\ncookie_secret = "not-a-secret"\n'
    'client_id = "enginecache"\nclient_secret = "not-a-secret"\n'
    'server_metadata_url = "http://127.0.0.1:9/.well-known/openid-configuration"\n'
)


@pytest.fixture(scope="module")
def base() -> str:
    missing = imagekit.missing_tools()
    if missing or os.geteuid() != 0:
        why = f"{', '.join(missing)} absent" if missing else "debootstrap and rootful podman need root"
        skip_or_fail(
            f"building the images needs root with buildah, podman, debootstrap and runc: {why} "
            f"({imagekit.INSTALL_HINT})"
        )
    return imagekit.base_image()


@pytest.fixture(scope="module")
def cpu_image(base: str) -> Iterator[str]:
    yield imagekit.build("Dockerfile", "cpu", base=base)


def test_the_image_serves_its_port_only_with_a_login_or_when_told_and_builds_inside(
    cpu_image: str, tmp_path: Path
) -> None:
    """Three containers of the image, as the README's `docker run` lines start them: told to open
    (ENGINECACHE_ADDRESS and ENGINECACHE_INSECURE_NO_AUTH) its health endpoint answers through the
    published port, and an ONNX Runtime engine builds inside (the container's own worker); with a
    login mounted it listens on 0.0.0.0 too; with neither it answers only inside (loopback) and says
    so."""
    secrets = tmp_path / "secrets.toml"
    secrets.write_text(LOGIN_SECRETS)
    secrets.chmod(0o644)
    config = imagekit.image_config(cpu_image)
    assert config["User"] == "10001:10001" and config["Cmd"] == ["serve", "--port", "8501"]
    with imagekit.containers(cpu_image) as started:
        told = started.start(env={"ENGINECACHE_ADDRESS": "0.0.0.0", "ENGINECACHE_INSECURE_NO_AUTH": "1"})
        login = started.start(volumes=[f"{secrets}:/app/.streamlit/secrets.toml:ro"])
        neither = started.start()
        for container in (told, login, neither):
            imagekit.wait_until_serving(container)
            assert container.healthy(), "the image's HEALTHCHECK (127.0.0.1 inside) holds wherever it listens"

        assert imagekit.host_health(told.host_port) == b"ok", told.logs()[-3000:]
        assert "WARNING: listening on 0.0.0.0 with NO LOGIN" in told.logs()
        assert imagekit.host_health(login.host_port) == b"ok", login.logs()[-3000:]
        assert "login required (Streamlit OIDC); listening on 0.0.0.0" in login.logs()
        assert imagekit.host_health(neither.host_port) is None, "no login, not told: the port must answer nothing"
        assert "no login is configured: listening on 127.0.0.1 only" in neither.logs()
        assert "ENGINECACHE_ADDRESS" in neither.logs(), "the note says how to open it"

        model = make_mlp(tmp_path / "tiny.onnx")
        model.chmod(0o644)
        imagekit.run(["podman", "cp", str(model), f"{told.name}:/tmp/tiny.onnx"], timeout=60)
        added = json.loads(told.exec("enginecache", "model", "add", "/tmp/tiny.onnx", "--name", "tiny", "--json"))
        assert added["name"] == "tiny", added
        built = json.loads(told.exec("enginecache", "build", "tiny", "--backend", "ort", "--json", timeout=600))
        assert built["status"] == "READY" and built["backend"] == "ort", built
        listed = json.loads(told.exec("enginecache", "engine", "list", "--json"))
        assert [e["status"] for e in listed] == ["READY"], listed


def test_the_gpu_variant_builds_with_its_tensorrt_base_substituted_by_the_local_debian_base(base: str) -> None:
    """Dockerfile.gpu with TRT_IMAGE set to the local bookworm base: NVIDIA's TensorRT image is on
    nvcr.io, which no host here reaches, so this base stands in for it (it has no TensorRT and no
    GPU driver: the image's own TensorRT is not tested here). Its instructions run: the venv, the
    dependencies and the gpu extra from PyPI (cuda-python, nvidia-ml-py, kvikio-cu13 and the CUDA
    libraries they pull), the non-root user; the installed CLI starts, and the gpu extra's modules
    import."""
    gpu_image = imagekit.build("Dockerfile.gpu", "gpu", base=base, build_args={"TRT_IMAGE": base})
    config = imagekit.image_config(gpu_image)
    assert config["User"] == "10001:10001" and config["Cmd"] == ["worker"], config
    assert any(re.match(r"PATH=/opt/enginecache/bin:", env) for env in config["Env"]), config["Env"]  # type: ignore[union-attr]
    out = imagekit.run(
        ["podman", "--runtime", "runc", "run", "--rm", *imagekit.rlimits(), gpu_image, "worker", "--help"],
        timeout=imagekit.PODMAN_SECONDS,
    )
    assert "Usage: enginecache worker" in out
    imports = imagekit.run(
        [
            "podman",
            "--runtime",
            "runc",
            "run",
            "--rm",
            *imagekit.rlimits(),
            "--entrypoint",
            "python3",
            gpu_image,
            "-c",
            "import cuda.bindings, pynvml, kvikio, enginecache; print('imported')",
        ],
        timeout=imagekit.PODMAN_SECONDS,
    )
    assert "imported" in imports
