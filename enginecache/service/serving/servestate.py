"""The serving state file: what a serving process loaded, for a readiness probe to check cheaply.

`load_or_build(..., state_file=PATH)` (or `ENGINECACHE_STATE_FILE`) writes it atomically after a
verified load: the process (pid, its start time in clock ticks since boot, the boot id), the engine
(id, blob path, the blob's stat at load, the digest that was verified) and the request (model file,
its digest, the spec). `enginecache ready --state PATH` (`check_state`) then answers for that
process's real state in well under a millisecond of work: the same boot, the same process still
alive (pid and start time: a reused pid is another process), the blob's stat unchanged (the bytes
the process verified are still what the store holds). Nothing is re-hashed and no database or
runtime is opened, so the cost does not grow with the engine's size. `LoadedEngine.close()` removes
the file: a closed engine is not ready.

Stdlib only: the probe imports this module and nothing heavier.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATE_SCHEMA = 1
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
# The blob's stat fields that change when its bytes can have: a chmod (ctime) does not count.
BLOB_STAT_FIELDS = ("size", "mtime_ns", "ino", "dev")


def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def process_start_ticks(pid: int) -> int | None:
    """Field 22 of /proc/PID/stat (start time in clock ticks since boot), or None where the process
    does not exist (or the OS has no /proc). The command name (field 2) may hold spaces and
    parentheses, so fields are counted after its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            text = stream.read()
    except OSError:
        return None
    fields = text[text.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])  # field 3 is fields[0]
    except (IndexError, ValueError):
        return None


def blob_stat(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, "dev": st.st_dev}


def write_state(path: Path, record: dict[str, Any]) -> Path:
    """Write this process's serving state to `path` atomically (a temp file in the same folder,
    then rename): a probe reads the old file or the new one, never half of one."""
    pid = os.getpid()
    data = {
        "schema": STATE_SCHEMA,
        "pid": pid,
        "start_ticks": process_start_ticks(pid),
        "boot_id": boot_id(),
        "hostname": os.uname().nodename,
        "written_at": time.time(),
        **record,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{pid}.tmp")
    with open(temp, "w", encoding="utf-8") as stream:
        json.dump(data, stream, indent=1)
    os.replace(temp, path)
    return path


def remove_state(path: Path, pid: int) -> None:
    """Remove the state file if it is still `pid`'s (another process may have replaced it)."""
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        return


class ProbeResult:
    """The probe's verdict (a plain class: the probe imports no `dataclasses` or `inspect`)."""

    __slots__ = ("ready", "reason", "state")

    def __init__(self, ready: bool, reason: str, state: dict[str, Any] | None = None) -> None:
        self.ready = ready
        self.reason = reason
        self.state = state or {}

    def __repr__(self) -> str:
        return f"ProbeResult(ready={self.ready!r}, reason={self.reason!r})"

    def to_dict(self) -> dict[str, Any]:
        engine = self.state.get("engine") or {}
        return {
            "ready": self.ready,
            "reason": self.reason,
            "engine_id": engine.get("id"),
            "pid": self.state.get("pid"),
        }


def check_state(path: Path) -> ProbeResult:
    """Is the process that wrote `path` still serving the engine it verified at load?"""
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return ProbeResult(False, f"no serving state at {path} (the engine is not loaded yet, or was closed)")
    except (OSError, ValueError) as err:
        return ProbeResult(False, f"serving state {path} is unreadable: {err}")
    if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
        return ProbeResult(False, f"serving state {path} is not one this version writes (schema {STATE_SCHEMA})")
    engine = state.get("engine") or {}
    pid = state.get("pid")
    if not isinstance(pid, int):
        return ProbeResult(False, f"serving state {path} names no process", state)
    recorded_boot = state.get("boot_id")
    if recorded_boot is not None and recorded_boot != boot_id():
        return ProbeResult(False, f"serving state {path} is from another boot", state)
    ticks = process_start_ticks(pid)
    if ticks is None:
        return ProbeResult(False, f"process {pid} that loaded engine {engine.get('id')} is gone", state)
    if state.get("start_ticks") is not None and ticks != state["start_ticks"]:
        return ProbeResult(
            False, f"process {pid} is not the one that loaded engine {engine.get('id')} (pid reused)", state
        )
    blob = engine.get("blob")
    if blob:
        try:
            now = blob_stat(Path(blob))
        except OSError as err:
            return ProbeResult(False, f"engine {engine.get('id')}'s blob is gone from the store: {err}", state)
        recorded = engine.get("blob_stat") or {}
        changed = [name for name in BLOB_STAT_FIELDS if recorded.get(name) != now[name]]
        if changed:
            return ProbeResult(
                False,
                f"engine {engine.get('id')}'s blob changed since it was verified at load ({', '.join(changed)}); "
                "run `enginecache verify`",
                state,
            )
    words = [str((state.get("model") or {}).get("name") or "")] + [
        str(engine.get(k) or "") for k in ("backend", "precision")
    ]
    what = " ".join(w for w in words if w)
    return ProbeResult(
        True, f"engine {engine.get('id')} ({what}) loaded and verified by pid {pid}; blob unchanged", state
    )
