"""Processes on this host: whether one still runs (gc's temp folders, a job's child checking its
worker), and the one way a process asks to die with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


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
