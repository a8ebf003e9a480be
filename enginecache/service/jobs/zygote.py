"""Child processes forked from a copy of this process: a one-shot worker's attempts, started warm.

A long-running worker starts each attempt from its fork server, a fresh interpreter that imports
`WARM_MODULES` once (seconds, paid back over many jobs). A command that runs one job on this host
(`service.builds.submitwait`) has no such time to spare, and it has already imported most of what the
attempt needs (the catalog, the build planning, the backends). So it forks a *zygote*, a copy of
itself taken while it still has one thread (a fork is only safe then: no lock can be held by a thread
that the copy lacks), and the zygote forks each attempt's child from that quiet state, on request.
Meanwhile the zygote imports what the job will need beyond that (its backend's library), on the
second core while the command claims the job.

The caller closes its database connections before (`Catalog.dispose()`): no open connection may
cross a fork, and each child opens its own.

Each attempt still runs in a child process of its own (a parser may segfault on a bad model): the
worker starts, kills (by its process group) and joins it as it would a multiprocessing child.
The zygote dies with the command (PR_SET_PDEATHSIG on Linux), and the child with the zygote.

The zygote answers one attempt at a time (a one-shot worker has one slot).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, Pipe
from typing import Any

from enginecache.core.processes import die_with_parent

logger = logging.getLogger(__name__)


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits; exit now where the parent is gone already."""
    try:
        die_with_parent()
    except OSError as err:
        logger.warning("zygote %s: %s", os.getpid(), err)
    if os.getppid() != parent:
        os._exit(0)


def _serve(conn: Connection, warm: Sequence[str], parent: int) -> None:
    """The zygote: import `warm`, then fork one child per request and report its pid and exit code."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C is the command's to handle
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the terminal's input is the command's, not ours
    os.close(devnull)
    for module in warm:
        with contextlib.suppress(Exception):  # a library that fails to import fails in the job, with its error
            importlib.import_module(module)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        target, args = request
        zygote = os.getpid()
        pid = os.fork()
        if pid == 0:
            # First thing: a fork clears the parent-death signal, and the command (so this zygote) may
            # be killed before the job's own code sets it again; from here on the child dies with us.
            _die_with_parent(zygote)
            conn.close()
            code = 1
            try:
                target(*args)
                code = 0
            except SystemExit as done:  # as multiprocessing reads it
                code = done.code if isinstance(done.code, int) else int(done.code is not None)
            except BaseException:  # noqa: BLE001 - a forked child must reach os._exit, whatever happened
                traceback.print_exc()
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        conn.send(("started", pid))
        _, status = os.waitpid(pid, 0)
        conn.send(("exited", os.waitstatus_to_exitcode(status)))


class ZygoteProcess:
    """One child of the zygote, as the worker uses a multiprocessing.Process: start, pid, join, exitcode."""

    def __init__(self, zygote: Zygote, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> None:
        self._zygote = zygote
        self._target = target
        self._args = args
        self.name = name
        self.pid: int | None = None
        self.exitcode: int | None = None

    def start(self) -> None:
        self.pid = self._zygote.fork(self._target, self._args)

    def join(self, timeout: float | None = None) -> None:
        if self.exitcode is None and self.pid is not None:
            self.exitcode = self._zygote.wait(timeout)


class Zygote:
    """A fork of this process that forks children on request; make it while this process has one thread.

    `Process(target=..., args=..., name=...)` is a `ZygoteProcess` (the worker's `children`);
    `close()` ends the zygote (call it when the worker is done)."""

    def __init__(self, *, warm: Sequence[str] = ()) -> None:
        if threading.active_count() > 1:
            raise RuntimeError("a zygote must be forked while this process has one thread")
        sys.stdout.flush()  # nothing buffered here may be written twice
        sys.stderr.flush()
        parent = os.getpid()
        ours, theirs = Pipe()
        pid = os.fork()
        if pid == 0:  # the zygote
            ours.close()
            try:
                _serve(theirs, warm, parent)
            finally:
                os._exit(0)
        theirs.close()
        self.pid = pid
        self._conn = ours
        self._lock = threading.Lock()
        self._closed = False

    def Process(  # multiprocessing's spelling: the worker calls context.Process(...)
        self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = ""
    ) -> ZygoteProcess:
        return ZygoteProcess(self, target, args, name)

    def fork(self, target: Callable[..., Any], args: tuple[Any, ...]) -> int:
        """Start `target(*args)` in a new child of the zygote; its pid."""
        with self._lock:
            try:
                self._conn.send((target, args))
                tag, pid = self._conn.recv()
            except (EOFError, OSError) as err:
                raise RuntimeError(f"the one-shot worker's zygote {self.pid} is gone: {err}") from err
        assert tag == "started"
        return int(pid)

    def wait(self, timeout: float | None) -> int | None:
        """The running child's exit code once it has exited (None while it runs after `timeout`)."""
        with self._lock:
            try:
                if not self._conn.poll(timeout):
                    return None
                tag, code = self._conn.recv()
            except (EOFError, OSError):  # the zygote died, and its child with it (PDEATHSIG)
                return -signal.SIGKILL
        assert tag == "exited"
        return int(code)

    def close(self, *, timeout: float = 5.0) -> None:
        """End the zygote (once its child, if one runs, has exited) and reap it; past `timeout`, kill
        it (its child dies with it)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._conn.close()
        deadline = time.monotonic() + timeout
        try:
            while os.waitpid(self.pid, os.WNOHANG) == (0, 0):
                if time.monotonic() >= deadline:
                    os.kill(self.pid, signal.SIGKILL)
                    os.waitpid(self.pid, 0)
                    return
                time.sleep(0.005)
        except ChildProcessError:
            pass
