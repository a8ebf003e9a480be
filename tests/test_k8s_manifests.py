"""deploy/k8s: every manifest valid against the Kubernetes schema (kubernetes-validate, strict: an
unknown or misplaced field fails), and what the fleet depends on holds: a build-worker Deployment per
GPU class selecting its nodes by GPU Feature Discovery's compute-capability labels, with the catalog
Secret and a GPU; the serving example pulling its engine in an init container into the volume the
server reads, with the readiness probe on the serving state every 2 s and resource limits; and every
enginecache command they run is a real command with real options."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer
import yaml

from enginecache.cli.app import app

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = sorted((ROOT / "deploy" / "k8s").glob("*.yaml"))
KUBERNETES = "1.37.0"


def _documents() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in MANIFESTS:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((f"{path.name}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


DOCS = _documents()


def _kind(kind: str) -> list[dict[str, Any]]:
    return [doc for _, doc in DOCS if doc["kind"] == kind]


@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[name for name, _ in DOCS])
def test_each_manifest_is_valid_for_kubernetes(name: str, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_a_schema_violation_is_caught() -> None:
    """The validator is not a formality: a misspelled field in a real manifest fails it."""
    [worker, *_] = [d for d in _kind("Deployment") if d["metadata"]["name"].startswith("enginecache-worker")]
    broken = yaml.safe_load(yaml.safe_dump(worker))
    broken["spec"]["template"]["spec"]["containers"][0]["resource"] = {}  # not "resources"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def _pod(deployment: dict[str, Any]) -> dict[str, Any]:
    return dict(deployment["spec"]["template"]["spec"])


def test_one_build_worker_deployment_per_gpu_class_on_its_nodes() -> None:
    workers = [d for d in _kind("Deployment") if d["metadata"]["name"].startswith("enginecache-worker-")]
    classes = {}
    for worker in workers:
        pod = _pod(worker)
        selector = pod["nodeSelector"]
        cc = f"sm{selector['nvidia.com/gpu.compute.major']}{selector['nvidia.com/gpu.compute.minor']}"
        assert worker["metadata"]["labels"]["enginecache.dev/gpu-class"] == cc
        [container] = pod["containers"]
        assert container["args"][0] == "worker" and container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert {"secretRef": {"name": "enginecache-catalog"}} in container["envFrom"]
        classes[cc] = worker
    assert len(classes) == len(workers) >= 3, "one Deployment per GPU class"
    [secret] = _kind("Secret")
    assert "ENGINECACHE_DB_URL" in secret["stringData"]


def test_the_serving_example_pulls_then_serves_with_the_cheap_readiness_probe() -> None:
    [serving] = [d for d in _kind("Deployment") if d["metadata"]["name"].endswith("-serving")]
    pod = _pod(serving)
    [init] = pod["initContainers"]
    assert init["args"][:2] == ["pull", "resnet18"] and "--dest" in init["args"]
    dest = init["args"][init["args"].index("--dest") + 1]
    shared = {m["name"] for m in init["volumeMounts"] if m["mountPath"] == dest}
    [server] = pod["containers"]
    assert shared and any(m["name"] in shared for m in server["volumeMounts"]), "the server reads what init pulled"
    probe = server["readinessProbe"]
    assert probe["periodSeconds"] == 2 and probe["exec"]["command"][:3] == ["enginecache", "ready", "--state"]
    for container in [init, server]:
        assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    [config] = _kind("ConfigMap")
    assert f"{dest}/manifests/resnet18.json" in config["data"]["server.py"]
    assert probe["exec"]["command"][3] in config["data"]["server.py"], "the state file the server writes"


def _argv_of(doc: dict[str, Any]) -> list[list[str]]:
    found = []
    pod = _pod(doc)
    for container in [*pod.get("initContainers", []), *pod["containers"]]:
        if container.get("image", "").startswith("enginecache") and "args" in container:
            found.append(container["args"])
        for probe in ("readinessProbe", "startupProbe", "livenessProbe"):
            command = container.get(probe, {}).get("exec", {}).get("command", [])
            if command[:1] == ["enginecache"]:
                found.append(command[1:])
    return found


def test_every_enginecache_command_in_the_manifests_parses() -> None:
    root = typer.main.get_command(app)
    argvs = [argv for doc in _kind("Deployment") for argv in _argv_of(doc)]
    assert len(argvs) >= 5
    for argv in argvs:
        words = [w.replace("$(POD_NAME)", "pod-0") for w in argv]
        with root.make_context("enginecache", list(words), resilient_parsing=True) as ctx:
            command = root.get_command(ctx, words[0])
            assert command is not None, f"no command {words[0]!r}"
            command.make_context(words[0], words[1:], parent=ctx)  # raises on an unknown option
