"""The serving lookup's memo: which engine the full lookup found for a request, under a key of
everything that answer depends on besides the catalog.

Contract:

- Why it exists: the cache key is computed by planning a build (`service.builds.plan.plan_build`: the
  model's recorded inputs, profiles, `core.precision.plan_recipe`, the backend's targets), which needs
  the ORM and onnx; a cache hit in a new process (`service.serving.hitpath`) must not import them. The
  full lookup (`service.serving.loadpath`) writes its answer here after planning; the hit reads it with
  the stdlib's sqlite3.
- The key (`memo_ingredients`): the model's digest, every `RuntimeSpec` field, the backend and its
  exact library version (what the plan puts in the key), the precision recipes' environment
  (`core.recipetools.recipe_environment`: the tool versions and ModelOpt's availability, named there
  once and read through the same names by `plan_recipe`), the host facts planning and the backend's
  compatibility rule read (`host_facts`), the code (`code_identity`: every enginecache source file's
  path, size and mtime, so an upgrade or an edit of the planning code is another key) and
  `MEMO_SCHEMA`. Any change is another key: a miss of the memo, answered by the full lookup.
- Beside the key the memo keeps the model's READY engine ids (`ready_list`): the hit serves the memo
  only while that set is unchanged and the engine is still READY, so a build, retire or CORRUPT mark
  sends the next lookup down the full path. A calibration file (whose digest the key would need) is
  never memoized.
- What it costs a hit: `code_identity` (one `stat` per source file, a few milliseconds) and one
  indexed row; what it saves: the full lookup's imports and planning, most of a second.
"""

from __future__ import annotations

import functools
import json
import os

import blake3

from enginecache.core.recipetools import recipe_environment

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy treats the name as True)
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from enginecache.core.backends.base import Backend
    from enginecache.core.fingerprint import HostFingerprint
    from enginecache.service.serving.runtimetypes import RuntimeSpec

MEMO_SCHEMA = 1
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))  # enginecache/, as a str


def _digest(value: Any) -> str:
    """BLAKE3 of canonical JSON (core.cachekey's canonical form; BLAKE3, which the hit already uses to
    verify its blob, not sha256: hashlib would load OpenSSL for this alone)."""
    return blake3.blake3(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@functools.lru_cache(maxsize=1)
def code_identity() -> str:
    """A digest of every enginecache source file's relative path, size and mtime: an upgrade or an
    edit of the code that plans builds changes it (one stat per file; the relative path is sliced off
    the root's string rather than computed by `os.path.relpath`)."""
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
        **recipe_environment(),  # "tools", "modelopt_importable"
        "host": host_facts(backend, host),
    }


def memo_key(ingredients: dict[str, Any]) -> str:
    return _digest(ingredients)


def ready_list(engine_ids: Iterable[int]) -> str:
    """The model's READY engine ids as the memo keeps them: '1,4,7'."""
    return ",".join(str(i) for i in sorted(engine_ids))
