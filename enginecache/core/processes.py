"""Processes on this host: whether one still runs (gc's temp folders, a job's child checking its
worker), the one way a process asks to die with its parent, and whether this process may fork.

A fork copies only the thread that calls it. It is safe while no other thread exists, Python's or
a library's own: a client that runs threads of its own (the S3 client's tokio runtime) says so with
`started_threads` when it starts them, and `fork_hazard` names what makes a fork unsafe now. Every
fork enginecache makes asks it first and starts a fresh interpreter instead where it answers."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

_THREAD_STARTERS: dict[str, int] = {}  # what started threads of its own here -> the pid it started them in


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs on this host (a zombie has ended: it is not alive)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    if not sys.platform.startswith("linux"):
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def die_with_parent(signum: int = signal.SIGKILL) -> None:
    """Have the kernel send this process `signum` when its parent exits (Linux: PR_SET_PDEATHSIG;
    elsewhere nothing is asked). OSError where the kernel refuses.

    The request is cleared by a fork and does not cover a parent gone already: a caller forked
    from a process that may exit meanwhile checks, after this, that the parent it expects is alive."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_PDEATHSIG): {os.strerror(errno)}")


def started_threads(what: str) -> None:
    """Record that `what` (a client, named for the reader) now runs threads of its own in this process:
    a fork of this process is unsafe from now on."""
    _THREAD_STARTERS.setdefault(what, os.getpid())


def threads_started_before_fork(what: str) -> int | None:
    """The pid of the process `what` started its threads in, where that is not this one (this
    process is a fork of it, and those threads are not here); None otherwise."""
    pid = _THREAD_STARTERS.get(what)
    return pid if pid is not None and pid != os.getpid() else None


def fork_hazard() -> str | None:
    """Why a fork of this process now would be unsafe (another thread may hold a lock, or a client's
    threads would be missing from the copy), or None where a fork is safe."""
    others = threading.active_count() - 1
    if others:
        return f"{others} other Python thread(s) run here"
    here = sorted(what for what, pid in _THREAD_STARTERS.items() if pid == os.getpid())
    if here:
        return ", ".join(here) + " run(s) threads of its own here"
    return None
