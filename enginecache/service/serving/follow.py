"""A serving process that follows its pull manifest: when a `pull --watch` sidecar replaces
`DIR/manifests/MODEL.json` (an alias moved: promote or rollback), the new engine is loaded beside the
old one and the process switches to it; a new engine that fails to load keeps the old one serving.

    follower = PulledFollower(manifest, spec=None, state_file=state)
    ...  # each request: follower.engine.infer(...)
    follower.poll()  # on the server's own timer, e.g. every few seconds

The notice is the manifest file itself (docs/fleet.md, "Alias moves reach running pods"): `poll()`
compares its stat (inode, size, mtime) with the last one seen, which costs one stat(2) when nothing
moved. When it moved and names another engine, that engine is loaded and verified
(`load_or_build`, `service.serving.pulled`); only once it loaded is `engine` switched, the serving
state for `enginecache ready --state` rewritten to name it (atomically: the probe never sees none),
and the old engine closed. A failed load (a corrupt or incompatible blob, a spec the new engine does
not meet) leaves `engine` and the serving state as they were and is kept in `last_error`; the same
manifest is not tried again until it is replaced (the next pull repairs a damaged copy and so
replaces it).

A request in flight on the old engine when `poll()` switches runs on a closed session: a server
that serves while it polls takes `engine` once per request under its own lock, as it does for any
session it closes.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from enginecache.errors import EngineCacheError
from enginecache.service.serving.runtime import load_or_build
from enginecache.service.serving.runtimetypes import LoadedEngine, RuntimeSpec

logger = logging.getLogger(__name__)

PollOutcome = Literal["unchanged", "switched", "kept"]  # kept: the new engine failed, the old one serves


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        found = path.stat()
    except FileNotFoundError:
        return None
    return (found.st_ino, found.st_size, found.st_mtime_ns)


def _named_sha256(path: Path) -> str | None:
    try:
        return str(json.loads(path.read_text())["engine"]["sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class PulledFollower:
    """The engine a pull manifest names, switched as the manifest moves (module docstring)."""

    manifest: Path
    spec: RuntimeSpec | None = None
    state_file: str | os.PathLike[str] | None = None
    db_url: str | None = None

    def __post_init__(self) -> None:
        self._seen = _stamp(self.manifest)
        self.engine: LoadedEngine = self._load()
        self.sha256 = _named_sha256(self.manifest)
        self.last_error: str | None = None
        self.switches = 0

    def _load(self) -> LoadedEngine:
        return load_or_build(self.manifest, spec=self.spec, db_url=self.db_url, state_file=self.state_file)

    def poll(self) -> PollOutcome:
        """Switch to the engine the manifest names now, where it moved (module docstring)."""
        stamp = _stamp(self.manifest)
        if stamp is None or stamp == self._seen:
            return "unchanged"
        self._seen = stamp
        named = _named_sha256(self.manifest)
        if named is None or named == self.sha256:
            return "unchanged"  # a half-seen or repaired manifest naming what is served
        old = self.engine
        state = old.state_file
        old.state_file = None  # the new load rewrites the state in place; the old close must not remove it
        try:
            new = self._load()
        except EngineCacheError as err:
            old.state_file = state
            self.last_error = f"engine {named[:12]} from {self.manifest} not loaded, still serving the old one: {err}"
            logger.warning("%s", self.last_error)
            return "kept"
        self.engine, self.sha256, self.last_error = new, named, None
        self.switches += 1
        old.close()
        return "switched"

    def close(self) -> None:
        self.engine.close()
