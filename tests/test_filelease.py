"""core.filelease against this machine's kernel: a read lease stands while only readers open the file,
an open for writing breaks it (seen by `intact()`, without a signal that would end the process),
a file someone holds open for writing gets none, and giving it back lets writers in. Every writer
here opens with O_NONBLOCK: the kernel refuses it at once (EWOULDBLOCK) and starts the lease break,
so nothing waits for /proc/sys/fs/lease-break-time."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from enginecache.core.filelease import take_read_lease

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="read leases are Linux's")


def _blob(tmp_path: Path) -> Path:
    path = tmp_path / "blob"
    path.write_bytes(os.urandom(100_000))
    return path


def _open_for_writing(path: Path | str) -> int | None:
    """An open for writing that does not wait on a lease: its descriptor, or None where a lease made
    the kernel refuse it (and start breaking that lease)."""
    try:
        return os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except BlockingIOError:
        return None


def test_a_lease_stands_while_only_readers_open_the_file(tmp_path: Path) -> None:
    path = _blob(tmp_path)
    lease = take_read_lease(str(path))
    assert lease is not None, "this kernel and filesystem give read leases"
    with lease:
        with open(path, "rb") as other, open(lease.path, "rb") as same:
            assert other.read() == same.read() == path.read_bytes()
        assert lease.intact()


def test_an_open_for_writing_breaks_the_lease(tmp_path: Path) -> None:
    path = _blob(tmp_path)
    lease = take_read_lease(str(path))
    assert lease is not None
    with lease:
        assert _open_for_writing(path) is None, "the kernel let a writer in past a read lease"
        assert not lease.intact()


def test_a_rename_over_the_name_does_not_redirect_the_leased_path(tmp_path: Path) -> None:
    """`path` is the leased inode itself: a file moved over the name is not what a runtime reads."""
    path = _blob(tmp_path)
    original = path.read_bytes()
    lease = take_read_lease(str(path))
    assert lease is not None
    with lease:
        replacement = tmp_path / "replacement"
        replacement.write_bytes(b"x" * len(original))
        replacement.replace(path)
        with open(lease.path, "rb") as stream:
            assert stream.read() == original
        assert lease.intact()


def test_no_lease_on_a_file_someone_holds_open_for_writing(tmp_path: Path) -> None:
    path = _blob(tmp_path)
    writer = os.open(path, os.O_WRONLY)
    try:
        assert take_read_lease(str(path)) is None
    finally:
        os.close(writer)
    lease = take_read_lease(str(path))
    assert lease is not None, "the writer is gone: a lease again"
    lease.close()


def test_giving_the_lease_back_lets_a_writer_in(tmp_path: Path) -> None:
    path = _blob(tmp_path)
    lease = take_read_lease(str(path))
    assert lease is not None
    lease.close()
    lease.close()  # twice is harmless
    writer = _open_for_writing(path)
    assert writer is not None, "a writer still waits on a lease given back"
    os.close(writer)


def test_closing_a_lease_the_kernel_already_took_back_is_no_error(tmp_path: Path) -> None:
    """A writer that waits past /proc/sys/fs/lease-break-time makes the kernel remove the lease; giving
    it back afterwards finds none (EAGAIN). Here the lease is removed by hand, as the kernel would."""
    import fcntl

    path = _blob(tmp_path)
    lease = take_read_lease(str(path))
    assert lease is not None
    fd = lease.fd
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
    assert not lease.intact()
    lease.close()
    with pytest.raises(OSError):
        os.fstat(fd)  # the descriptor is closed all the same


def test_no_lease_where_there_is_no_proc_to_name_it_by(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime opens the leased file as /proc/self/fd/N; without /proc (a sandbox) there is no lease,
    and the one taken is given back (a writer gets in)."""
    from enginecache.core import filelease

    path = _blob(tmp_path)
    monkeypatch.setattr(filelease.os.path, "exists", lambda _path: False)
    assert take_read_lease(str(path)) is None
    monkeypatch.undo()
    writer = _open_for_writing(path)
    assert writer is not None, "the lease taken before the check was not given back"
    os.close(writer)


def test_a_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        take_read_lease(str(tmp_path / "absent"))


BREAK_IN_A_NEW_PROCESS = """
import os, sys
from enginecache.core.filelease import take_read_lease
lease = take_read_lease(sys.argv[1])
assert lease is not None
try:
    os.open(sys.argv[1], os.O_WRONLY | os.O_NONBLOCK)
except BlockingIOError:
    pass  # a signal the break sent is delivered as that call returns: none is expected at all
print("intact" if lease.intact() else "broken")
lease.close()
"""


def test_a_broken_lease_does_not_end_the_process(tmp_path: Path) -> None:
    """The kernel signals a lease's holder when it breaks, SIGIO by default, whose default action ends
    the process; the lease sends none (and SIGURG, ignored by default, in the moment it is taken)."""
    path = _blob(tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", BREAK_IN_A_NEW_PROCESS, str(path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, f"ended by signal {-done.returncode}" if done.returncode < 0 else done.stderr
    assert done.stdout.strip() == "broken"
