"""What a backup or a restore killed with SIGKILL leaves, and `enginecache gc` removing it: a real
`backup` (or `restore`) process is stopped at a fixed point (its progress callback, or the step after
the catalog is staged, blocks on stdin and says so on stdout), then killed. While it lives gc keeps
its folder, however old; once it is dead gc keeps it until nothing in it changed for the grace, then
removes it (and the backup's claim).

Ages come from the injected clock: nothing sleeps."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from enginecache.db.catalogfile import sqlite_url
from enginecache.service.context import AppContext
from enginecache.service.maintenance.backup.usecases import backup, restore
from enginecache.service.maintenance.gc.files import tree_size
from enginecache.service.maintenance.gc.report import BACKUP_PARTIAL, DEFAULT_GRACE, RESTORE_PARTIAL
from tests.conftest import FakeClock
from tests.gckit import BOUND, ROOT, ort_engine, removed_paths, run_gc
from tests.modelfactory import make_mlp

PAST_GRACE = (DEFAULT_GRACE + timedelta(hours=1)).total_seconds()

# Runs a backup (argv: home, db_url, "backup", dest) or a restore (argv: home, db_url, "restore", src)
# and stops at the backup's "copied" phase (every file copied, nothing published) or at the restore's
# migration (the catalog staged, nothing published): says "stopped" and blocks until killed.
_STOPPED = """
import sys
from pathlib import Path
from enginecache.service.context import AppContext
from enginecache.service.maintenance.backup import restore as restoring
from enginecache.service.maintenance.backup.usecases import backup, restore

home, db_url, what, folder = sys.argv[1:5]

def stop(*_args):
    print("stopped", flush=True)
    sys.stdin.read()
    raise SystemExit("not killed")

app = AppContext.from_settings(home, db_url)
if what == "backup":
    backup(app, Path(folder), progress=lambda phase, _message: stop() if phase == "copied" else None)
else:
    restoring.migrate_to_head = stop
    restore(app, Path(folder))
"""


@contextmanager
def _stopped(home: Path, db_url: str, what: str, folder: Path) -> Iterator[subprocess.Popen[str]]:
    """The process running `what`, stopped at its fixed point; SIGKILLed when the block ends."""
    process = subprocess.Popen(
        [sys.executable, "-c", _STOPPED, str(home), db_url, what, str(folder)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()  # "" if it ended instead
        assert line == "stopped\n", process.communicate(timeout=BOUND)
        yield process
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=BOUND)
    assert process.returncode == -signal.SIGKILL


def _named(folder: Path, infix: str) -> list[Path]:
    return sorted(p for p in folder.iterdir() if infix in p.name)


def test_a_killed_backups_folder_is_kept_while_it_runs_and_removed_by_gc_after_the_grace(
    app_ctx: AppContext, tmp_path: Path
) -> None:
    app = app_ctx
    ort_engine(app, make_mlp(tmp_path / "src" / "m.onnx"), "m")
    dest = tmp_path / "backups" / "nightly"
    dest.parent.mkdir()
    with _stopped(app.home, app.db_url, "backup", dest):
        [partial] = _named(dest.parent, ".nightly.partial-")
        [claim] = _named(app.store.tmp_dir, ".claim")
        size = tree_size(partial)
        assert size > 0 and (partial / "catalog.db").is_file()
        late = FakeClock()
        late.advance(30 * PAST_GRACE)
        running = run_gc(app, late, apply=True)
        assert not removed_paths(running, BACKUP_PARTIAL) and partial.is_dir() and claim.is_file()
        assert {k.path: k.reason for k in running.kept}[str(partial)] == "a backup is writing it"
    assert partial.is_dir() and claim.is_file() and not dest.exists()  # what kill -9 leaves

    clock = FakeClock()
    young = run_gc(app, clock, apply=True)
    assert not removed_paths(young, BACKUP_PARTIAL)
    reason = {k.path: k.reason for k in young.kept}[str(partial)]
    assert f"left by a backup to {dest}" in reason and "removed once unchanged for 7.0 days" in reason

    clock.advance(PAST_GRACE)
    dry = run_gc(app, clock, apply=False)
    [planned] = [r for r in dry.removals if r.kind == BACKUP_PARTIAL]
    assert (planned.path, planned.size_bytes) == (str(partial), size) and partial.is_dir()
    report = run_gc(app, clock, apply=True)
    assert removed_paths(report, BACKUP_PARTIAL) == {str(partial)} and report.ok
    assert not partial.exists() and not claim.exists()
    assert backup(app, dest).dest == dest  # the next backup to that folder goes ahead
    assert _named(dest.parent, ".partial-") == [] and _named(app.store.tmp_dir, ".claim") == []


def test_a_killed_restores_folder_and_staged_catalog_are_removed_by_gc_of_the_home_after_the_grace(
    app_ctx: AppContext, tmp_path: Path
) -> None:
    app = app_ctx
    ort_engine(app, make_mlp(tmp_path / "src" / "m.onnx"), "m")
    saved = backup(app, tmp_path / "backup").dest
    home, catalogs = tmp_path / "restored", tmp_path / "catalogs"
    catalogs.mkdir()
    url = sqlite_url(catalogs / "restored.db")  # outside the home: staged beside it
    with _stopped(home, url, "restore", saved):
        [folder] = _named(tmp_path, ".restored.restore-")
        [staged] = _named(catalogs, ".restored.db.restore-")
        assert staged.name.endswith(folder.name)
    assert not home.exists() and not (catalogs / "restored.db").exists()  # nothing published

    target = AppContext.from_settings(home, url)
    try:
        restore(target, saved)  # the debris does not stand in the way
        clock = FakeClock()
        young = run_gc(target, clock, apply=True)
        assert not removed_paths(young, RESTORE_PARTIAL)
        kept = {k.path: k.reason for k in young.kept if k.kind == RESTORE_PARTIAL}
        assert set(kept) == {str(folder), str(staged)}
        assert "left by a restore of this home that did not finish" in kept[str(folder)]

        clock.advance(PAST_GRACE)
        report = run_gc(target, clock, apply=True)
        assert removed_paths(report, RESTORE_PARTIAL) == {str(folder), str(staged)} and report.ok
        assert not folder.exists() and not staged.exists()
        assert (catalogs / "restored.db").is_file() and home.is_dir()
    finally:
        target.close()
