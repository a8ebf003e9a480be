"""The serving lookup's memo: which engine `load_or_build` found for a request, remembered.

The full lookup (`service.serving.loadpath`: model by digest, `plan_build`, `lookup.find_engine`) needs the
ORM, the model's recorded inputs and the precision recipes; a cache hit in a new process must not
pay for importing them. So after a full-path hit the answer is written to `engine_memos` under a
key of everything that answer depends on, and `service.serving.hitpath` reads it back with the stdlib's
sqlite3:

- the model's digest (from the stat cache) and every `RuntimeSpec` field;
- the backend's exact library version (what `plan_build` puts in the cache key), the versions of
  the precision tools `core.precision.plan_recipe` names, and whether ModelOpt is importable (it
  picks the fp16 converter);
- the host facts planning and `find_engine`'s compatibility rule read: OS, machine, CPU target,
  and for a GPU backend each GPU's name and compute capability;
- the code that planned it (`code_identity`: every enginecache source file's size and mtime, so
  also `core.cachekey.KEY_SCHEMA`) and the memo's own schema.

Any change is a different key: a miss of the memo, answered by the full path, which writes it anew.
Beside the key the memo keeps the model's READY engine ids at the time (`find_engine` chooses
among them), so a build, retire, un-retire or CORRUPT mark of any of them also sends the next
lookup down the full path. A calibration file (whose digest the key would need) is never memoized.
"""

from __future__ import annotations

import functools
import json
import os

import blake3

from enginecache.core.fingerprint import distribution_version
from enginecache.core.lazyimport import importable

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from enginecache.core.backends.base import Backend
    from enginecache.core.fingerprint import HostFingerprint
    from enginecache.service.serving.runtimetypes import RuntimeSpec

MEMO_SCHEMA = 1
# The distributions core.precision.recipes.plan_recipe records as `tool_version`.
PRECISION_TOOLS = ("onnxruntime", "onnxconverter-common", "nvidia-modelopt")
# What core.precision.availability.modelopt_available() looks for (it picks AutoCast for fp16), asked the
# same way (core.lazyimport.importable); not imported from there: core.precision's package imports a lot.
MODELOPT_MODULES = ("modelopt", "torch", "onnx_graphsurgeon")
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # enginecache/, as a str


def _digest(value: Any) -> str:
    """BLAKE3 of canonical JSON (core.cachekey's canonical form; BLAKE3, not sha256: hashlib loads
    OpenSSL, ~2 ms that a hit, which verifies its blob with BLAKE3, would pay for nothing else)."""
    return blake3.blake3(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """A digest of every enginecache source file's relative path, size and mtime: an upgrade or an
    edit of the code that plans builds changes it (one stat per file: about 2 ms for 200 files; the
    relative path is sliced off, as `os.path.relpath` took 3 ms more for the same strings)."""
    entries: list[tuple[str, int, int]] = []
    root = str(PACKAGE_ROOT)
    prefix = len(root) + 1  # every entry's path is root + "/" + its relative path
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            with os.scandir(folder) as listing:
                for entry in listing:
                    if entry.is_dir(follow_symlinks=False):
                        if entry.name != "__pycache__":
                            folders.append(entry.path)
                    elif entry.name.endswith(".py"):
                        st = entry.stat()
                        entries.append((entry.path[prefix:], st.st_size, st.st_mtime_ns))
        except OSError:
            continue
    return _digest(sorted(entries))


def host_facts(backend: Backend, host: HostFingerprint) -> dict[str, Any]:
    """The host facts a plan and the backend's compatibility rule read (GPUs only for a GPU backend)."""
    return {
        "os": host.os,
        "machine": host.machine,
        "cpu_target": host.cpu_target,
        "gpus": [[g.name, g.compute_capability] for g in host.gpus] if backend.device == "gpu" else None,
    }


def memo_ingredients(
    onnx_digest: str, spec: RuntimeSpec, backend: Backend, backend_version: str, host: HostFingerprint
) -> dict[str, Any]:
    """Everything the full lookup's answer depends on besides the catalog's READY engines."""
    return {
        "memo_schema": MEMO_SCHEMA,
        "code": code_identity(),
        "onnx_digest": onnx_digest,
        "spec": spec.to_dict(),
        "backend": backend.name,
        "backend_version": backend_version,
        "tools": {name: distribution_version(name) for name in PRECISION_TOOLS},
        "modelopt_importable": all(importable(name) for name in MODELOPT_MODULES),
        "host": host_facts(backend, host),
    }


def memo_key(ingredients: dict[str, Any]) -> str:
    return _digest(ingredients)


def ready_list(engine_ids: Iterable[int]) -> str:
    """The model's READY engine ids as the memo keeps them: '1,4,7'."""
    return ",".join(str(i) for i in sorted(engine_ids))
