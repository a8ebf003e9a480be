"""Job attempts' child processes, forked from a warm copy of the worker: the zygote.

A worker makes its zygote before it starts any thread: a fork of itself (a fork is only safe while
the process has one thread: no lock can be held by a thread that the copy lacks). The zygote
imports what the jobs need beyond what the worker has (`warm`: the backends' libraries), says it is
ready, and then forks each attempt's child from that quiet state on request, any number at a time,
reporting each child's pid as it starts and its exit code as it ends. The worker has already
imported most of what an attempt needs (the catalog, the build planning), so a child starts warm
without a fresh interpreter: a one-shot worker's job (`service.builds.submitwait`) as much as a
long-running worker's.

The caller closes its database connections before (`Catalog.dispose()`): no open connection may
cross a fork, and each child opens its own.

Each attempt still runs in a child process of its own (a parser may segfault on a bad model): the
worker starts, kills (by its process group) and joins it as it would a multiprocessing child
(`Zygote.Process`). The zygote dies with its maker and each child with the zygote
(`core.processes.die_with_parent`); a terminal's ^C is the maker's to handle, not the zygote's.
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
from multiprocessing.connection import Connection, Pipe, wait
from typing import Any

from enginecache.core.processes import die_with_parent, fork_hazard

logger = logging.getLogger(__name__)

# What the zygote answers: ("ready",) once warm, ("started", pid) for each fork request in order,
# ("exited", pid, exit code) as each child ends (a signal's as multiprocessing gives it: minus its number).
Message = tuple[Any, ...]


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent exits; exit now where the parent is gone already."""
    try:
        die_with_parent()
    except OSError as err:
        logger.warning("zygote %s: %s", os.getpid(), err)
    if os.getppid() != parent:
        os._exit(0)


def _serve(conn: Connection, warm: Sequence[str], parent: int) -> None:
    """The zygote: import `warm`, then fork one child per request until told to stop (None) or its
    maker is gone; report each child's start and end. Told to stop, it waits for its children."""
    _die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ^C and a stop request are the maker's to handle
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the terminal's input is the maker's, not ours
    os.close(devnull)
    for module in warm:
        with contextlib.suppress(Exception):  # a library that fails to import fails in the job, with its error
            importlib.import_module(module)
    # A child's end wakes the loop below: SIGCHLD, through a pipe the signal writes to.
    woken, wake = os.pipe()
    os.set_blocking(woken, False)
    os.set_blocking(wake, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake)
    children: set[int] = set()
    stopping = False
    try:
        conn.send(("ready",))
        while children or not stopping:
            readable = wait([woken] if stopping else [conn, woken])
            if woken in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(woken, 4096)
            for pid, code in _reap(children):
                if not stopping:
                    conn.send(("exited", pid, code))
            if conn in readable:
                request = conn.recv()
                if request is None:
                    stopping = True
                    continue
                target, args = request
                pid = _fork_child(target, args, close=(conn, woken, wake))
                children.add(pid)
                conn.send(("started", pid))
    except (EOFError, OSError):
        return  # the maker is gone: our children die with us


def _reap(children: set[int]) -> list[tuple[int, int]]:
    """The children that have ended (each reaped, removed from `children`) and their exit codes."""
    ended = []
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            ended.append((pid, os.waitstatus_to_exitcode(status)))
    return ended


def _fork_child(target: Callable[..., Any], args: tuple[Any, ...], *, close: tuple[Any, ...]) -> int:
    """Fork a child that runs `target(*args)` and exits with the code multiprocessing would give it."""
    zygote = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    # First thing: a fork clears the parent-death signal, and the maker (so this zygote) may be
    # killed before the job's own code sets it again; from here on the child dies with us.
    _die_with_parent(zygote)
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for resource in close:
        if isinstance(resource, int):
            os.close(resource)
        else:
            resource.close()
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
            self.exitcode = self._zygote.wait(self.pid, timeout)


class Zygote:
    """A fork of this process that forks children on request; make it while this process has one thread.

    `Process(target=..., args=..., name=...)` is a `ZygoteProcess` (the worker's `children`); any
    number may run at once, and any thread may start or join one. `close()` ends the zygote (call
    it when the worker is done)."""

    def __init__(self, *, warm: Sequence[str] = ()) -> None:
        hazard = fork_hazard()
        if hazard is not None:
            raise RuntimeError(f"a zygote must be forked while this process has one thread: {hazard}")
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
        self._forking = threading.Lock()  # one fork request at a time: its answer is the next "started"
        self._news = threading.Condition()  # guards what was read below; notified after each message
        self._reading = False  # a thread is reading the pipe (the others wait on `_news`)
        self._ready = False
        self._started: list[int] = []
        self._exits: dict[int, int] = {}
        self._gone: str | None = None  # why the zygote answers no more
        self._closed = False

    def Process(  # multiprocessing's spelling: the worker calls context.Process(...)
        self, target: Callable[..., Any], args: tuple[Any, ...] = (), name: str = ""
    ) -> ZygoteProcess:
        return ZygoteProcess(self, target, args, name)

    def wait_ready(self) -> None:
        """Return once the zygote has imported what it warms (RuntimeError where it died first)."""
        self._await(lambda: self._ready, None)
        if not self._ready:
            raise RuntimeError(f"the zygote {self.pid} is gone: {self._gone}")

    def fork(self, target: Callable[..., Any], args: tuple[Any, ...]) -> int:
        """Start `target(*args)` in a new child of the zygote; its pid."""
        with self._forking:
            try:
                self._conn.send((target, args))
            except OSError as err:
                raise RuntimeError(f"the zygote {self.pid} is gone: {err}") from err
            self._await(lambda: bool(self._started), None)
            with self._news:
                if not self._started:
                    raise RuntimeError(f"the zygote {self.pid} is gone: {self._gone}")
                return self._started.pop(0)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """Child `pid`'s exit code once it has exited (None while it runs after `timeout`)."""
        self._await(lambda: pid in self._exits, timeout)
        with self._news:
            if pid in self._exits:
                return self._exits.pop(pid)
            if self._gone is not None:  # the zygote died, and its children with it (die_with_parent)
                return -signal.SIGKILL
            return None

    def _await(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Read the zygote's messages until `done()` holds, the zygote is gone, or `timeout` passes.
        One thread reads at a time; the others wait for what it reads."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._news:
            while not done() and self._gone is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                if self._reading:
                    self._news.wait(remaining)
                    continue
                self._reading = True
                self._news.release()
                message = None
                try:
                    message = self._receive(remaining)
                finally:
                    self._news.acquire()
                    self._reading = False
                    if message is not None:
                        self._take(message)
                    self._news.notify_all()

    def _receive(self, timeout: float | None) -> Message | None:
        """The zygote's next message, None where none came within `timeout`."""
        try:
            if not self._conn.poll(timeout):
                return None
            message: Message = self._conn.recv()
        except (EOFError, OSError) as err:
            return ("gone", f"{type(err).__name__}: {err}")
        return message

    def _take(self, message: Message) -> None:
        tag = message[0]
        if tag == "ready":
            self._ready = True
        elif tag == "started":
            self._started.append(int(message[1]))
        elif tag == "exited":
            self._exits[int(message[1])] = int(message[2])
        else:
            self._gone = str(message[1])

    def close(self, *, timeout: float = 5.0) -> None:
        """End the zygote (once its children have exited) and reap it; past `timeout`, kill it (its
        children die with it)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):  # gone already: nothing to tell it
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
