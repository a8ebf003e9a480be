"""A read lease on a store file: the kernel's word that no one opened it for writing, or truncated
it, while we held it.

A runtime that reads an engine file itself (ONNX Runtime) loads it with the memory of a load by
hand, one copy fewer than handing it our verified buffer; one that deserializes from memory
(TensorRT) can be handed a read-only mapping of the file (`core.verifiedread.map_file`). Either is
sound only if the bytes it reads are the bytes we hashed. Linux gives that guarantee with
`fcntl(F_SETLEASE, F_RDLCK)`:

- The lease is granted only while no one has the file open for writing (a writable shared
  mapping included), and only to the file's owner (or CAP_LEASE).
- While it is held, an `open` for writing or a `truncate` of the file breaks it: the writer waits
  (up to /proc/sys/fs/lease-break-time, 45 s) and `F_GETLEASE` no longer answers F_RDLCK.
- So a file hashed after the lease was taken, read by the runtime through `path` (this process's
  `/proc/self/fd/N`: the same inode, whatever the name now points at), and whose lease is still
  `intact()` afterwards, held the hashed bytes all along.

The break's signal (SIGIO by default, whose default action ends the process) is turned into one
nothing acts on: SIGURG while the lease is taken, then no owner to signal at all. Where no lease
can be had (another filesystem, NFS; a file owned by someone else; a writer holding it open),
or where this process has no /proc to name the leased file by, `take_read_lease` answers None
and the caller reads a verified copy instead.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys

# Why a lease cannot be had here; anything else is the file's own problem (missing, unreadable).
_NO_LEASE_HERE = frozenset({errno.EAGAIN, errno.EACCES, errno.EPERM, errno.EINVAL, errno.ENOLCK, errno.ENOSYS})


class ReadLease:
    """An open, read-only descriptor of a file with a read lease on it; `close()` (or leaving the
    `with` block) gives the lease back and closes the descriptor."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @property
    def path(self) -> str:
        """A path to the leased file itself (not to whatever its name points at by now)."""
        return f"/proc/self/fd/{self.fd}"

    def intact(self) -> bool:
        """Whether the lease still stands: no one opened the file for writing, or truncated it, since
        it was taken."""
        return fcntl.fcntl(self.fd, fcntl.F_GETLEASE) == fcntl.F_RDLCK

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)  # a waiting writer goes on now
        except OSError as err:
            # EAGAIN: no lease left to give back. A writer waited past lease-break-time and the
            # kernel took it (`intact()` said so); anything else is a real failure.
            if err.errno != errno.EAGAIN:
                raise
        finally:
            os.close(fd)

    def __enter__(self) -> ReadLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def take_read_lease(path: str) -> ReadLease | None:
    """A read lease on `path`, or None where this host cannot give one (not Linux, another
    filesystem, not the file's owner, or someone has it open for writing). Raises OSError where the
    file cannot be opened for reading (FileNotFoundError for a missing one)."""
    if not sys.platform.startswith("linux"):
        return None
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        import signal  # this path alone pays for it

        fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)  # a break in the next lines must not end us
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETOWN, 0)  # and once the lease is ours, nobody is signalled
    except OSError as err:
        os.close(fd)
        if err.errno in _NO_LEASE_HERE:
            return None
        raise
    lease = ReadLease(fd)
    if not os.path.exists(lease.path):  # no /proc here (a sandbox): a runtime could not open the lease's path
        lease.close()
        return None
    return lease
